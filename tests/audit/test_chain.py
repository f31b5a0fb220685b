"""The audit chain detects edits, deletions and reordering made directly in the database."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from service import audit
from service.db.models import AuditEvent


def seed(db, n=5):
    with db.transaction() as s:
        for i in range(n):
            audit.append(
                s, actor="tester", kind="node.registered", subject=f"node:n{i}", node=f"n{i}", payload={"i": i}
            )


def verify(db):
    with db.transaction() as s:
        return audit.verify_chain(s)


def test_intact_chain(db):
    seed(db)
    out = verify(db)
    assert out["ok"] is True and out["events"] == 5 and len(out["head"]) == 64


def test_edited_payload_is_named(db):
    seed(db)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET payload = :p WHERE id = 3"), {"p": '{"i": 99}'})
    out = verify(db)
    assert out["ok"] is False and out["first_broken"]["id"] == 3 and "edited" in out["first_broken"]["reason"]


def test_edited_actor_is_named(db):
    seed(db)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE id = 2"))
    assert verify(db)["first_broken"]["id"] == 2


def test_deleted_row_breaks_the_next_link(db):
    seed(db)
    with db.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE id = 2"))
    out = verify(db)
    assert out["ok"] is False and out["first_broken"]["id"] == 3


def test_reordered_rows_are_detected(db):
    seed(db)
    with db.engine.begin() as conn:
        rows = conn.execute(text("SELECT id, subject, node FROM audit_events WHERE id IN (2, 3) ORDER BY id")).all()
        conn.execute(
            text("UPDATE audit_events SET subject = :s, node = :n WHERE id = :i"),
            [{"s": rows[1].subject, "n": rows[1].node, "i": 2}, {"s": rows[0].subject, "n": rows[0].node, "i": 3}],
        )
    assert verify(db)["first_broken"]["id"] == 2


def test_failed_transaction_leaves_no_event(db):
    seed(db, 2)
    try:
        with db.transaction() as s:
            audit.append(s, actor="t", kind="plan.created", subject="plan:x", payload={})
            raise RuntimeError("crash mid-transaction")
    except RuntimeError:
        pass
    with db.transaction() as s:
        assert s.query(AuditEvent).count() == 2
    assert verify(db)["ok"] is True


def test_events_are_pending_until_sealed_then_chained_in_write_order(db):
    with db.sessions() as s:  # a raw session: no seal after commit
        with s.begin():
            for i in range(3):
                audit.append(s, actor="t", kind="node.registered", subject=f"node:p{i}", payload={"i": i})
    with db.sessions() as s:
        out = audit.verify_chain(s)
        assert {k: out[k] for k in ("ok", "events", "head", "last_seq", "pending")} == {
            "ok": True,
            "events": 0,
            "head": audit.GENESIS,
            "last_seq": 0,
            "pending": 3,
        }
    assert db.sealer.seal_now() == 3
    with db.transaction() as s:
        out = audit.verify_chain(s)
        seqs = [e.chain_seq for e in s.query(AuditEvent).order_by(AuditEvent.id)]
    assert out["ok"] and out["events"] == 3 and out["pending"] == 0 and seqs == [1, 2, 3]


def test_canonical_fast_path_is_rfc8785_for_flat_field_sets():
    import rfc8785
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from service.audit import canonical

    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53) + 1, 2**53 - 1),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
    )

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(st.dictionaries(st.text(alphabet=st.characters(max_codepoint=127), max_size=12), scalar, max_size=12))
    def check(d):
        assert canonical(d) == rfc8785.dumps(d)

    check()


def test_fixed_field_records_are_rfc8785():
    """The hash and MAC inputs (``_record``: fixed, sorted field sets without a sort per event) are byte for byte
    RFC 8785, whatever the values — non-ASCII, control characters, unsafe integers and booleans take the generic path."""
    import rfc8785
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from service.audit.encoding import _HASH_KEYS, _MAC_KEYS, _SEALED_KEYS, _record

    value = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**60), 2**60),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
    )
    for keys in (_HASH_KEYS, _MAC_KEYS, _SEALED_KEYS):
        assert list(keys) == sorted(keys)

        @settings(max_examples=200, derandomize=True, deadline=None)
        @given(st.tuples(*[value] * len(keys)))
        def check(values):  # runs within this iteration: the loop variable is the one meant
            d = dict(zip(keys, values))  # noqa: B023
            try:
                want = rfc8785.dumps(d)
            except Exception:  # integers rfc8785 refuses: so must the record
                with pytest.raises(Exception):  # noqa: B017 - whichever error: the record must refuse too
                    _record(keys, values)  # noqa: B023
                return
            assert _record(keys, values) == want  # noqa: B023

        check()
