"""Policy profiles: which of the operators' rules (docs/operating.md) refuse a launch, warn, or are off, per
environment, with the thresholds of the rules that have them — set by the operator like a cluster admission policy.

A profile is TOML (``tomllib`` is in the standard library from Python 3.11, so the base install a GPU node runs needs
no parser, and TOML keeps the operator's comments on why a rule is set as it is). The shipped profile is
``service/data/policy/default.toml``; an operator's file is read over it, rule by rule, so a file states only what
it changes, and the profile that judges is always complete. Its digest (SHA-256 over the complete profile as
canonical JSON) is what a plan records.

Only the operators' rules may be named: the rules whose registered source is an operating.md section. vLLM's own
start-up checks are never downgradable (vLLM would refuse the launch whatever a profile says), and Preflight's
safety gates (what a launch may load, write or leave unjudged: loading.POLICY_RULES) are not the operator's advice:
a profile naming either is refused when it is read.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import stat
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from .findings import Finding, Severity

Action = Literal["enforce", "warn", "off"]
ACTIONS: tuple[str, ...] = typing.get_args(Action)
OPERATING_SOURCE = "docs/operating.md"
# the rules a profile may give thresholds, with the value each measures (a finding carries it as data["value"])
THRESHOLDS = {"util_too_high": "gpu_memory_utilization"}
THRESHOLD_KEYS = ("warn_above", "refuse_above")
MAX_PROFILE_BYTES = 65_536
DEFAULT_FILE = pathlib.Path(__file__).resolve().parent.parent / "data" / "policy" / "default.toml"


class ProfileError(ValueError):
    """A profile that cannot be used: the message names the file and the key."""


@dataclass(frozen=True)
class RulePolicy:
    """One rule in one environment: ``enforce`` (an error; for a rule with thresholds: above ``refuse_above``, and
    a warning above ``warn_above``), ``warn`` (a warning; above ``warn_above``), or ``off`` (no finding)."""

    action: Action
    warn_above: float | None = None
    refuse_above: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def applied(self, finding: Finding, profile: str) -> Finding | None:
        """``finding`` with the severity this policy gives it (None when off)."""
        if self.action == "off":
            return None
        value = finding.data.get("value")
        refuse = self.action == "enforce" and (
            self.refuse_above is None or (isinstance(value, (int, float)) and value > self.refuse_above)
        )
        data = {**finding.data, "policy": {"profile": profile, "action": "enforce" if refuse else "warn"}}
        return dataclasses.replace(finding, severity=Severity.ERROR if refuse else Severity.WARNING, data=data)


@dataclass(frozen=True)
class Profile:
    """A complete profile: every operator rule's policy in every environment."""

    name: str
    environments: Mapping[str, Mapping[str, RulePolicy]]

    def content(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "environments": {
                env: {code: p.as_dict() for code, p in sorted(rules.items())}
                for env, rules in sorted(self.environments.items())
            },
        }

    @functools.cached_property
    def digest(self) -> str:  # once per profile: every judged launch records it (frozen: the content never changes)
        text = json.dumps(self.content(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def provenance(self) -> dict[str, str]:
        """What a plan records of the profile that judged it."""
        return {"name": self.name, "digest": self.digest}

    def rules_for(self, environment: str) -> Mapping[str, RulePolicy]:
        return self.environments[environment]

    def judge(self, findings: list[Finding], environment: str) -> list[Finding]:
        """The findings as this profile rules them in ``environment``: an operator rule's finding takes the
        profile's severity (or is dropped when off); every other finding is left as its rule emitted it."""
        rules = self.environments[environment]
        out = []
        for f in findings:
            policy = rules.get(f.rule)
            ruled = f if policy is None else policy.applied(f, self.name)
            if ruled is not None:
                out.append(ruled)
        return out


def environments() -> tuple[str, ...]:
    """The environments a launch request may name (request.py's ``environment``)."""
    from .request import LaunchRequest

    return typing.get_args(LaunchRequest.model_fields["environment"].annotation)


@cache
def rule_classes() -> tuple[frozenset[str], frozenset[str], dict[str, str]]:
    """(operator rule codes, safety gate codes, every other registered code → its vLLM source), from the registry."""
    from .loading import POLICY_RULES
    from .rules import RULES

    operator = frozenset(c for r in RULES if r.source.startswith(OPERATING_SOURCE) for c in r.codes)
    vllm = {c: r.source for r in RULES for c in r.codes if c not in operator and c not in POLICY_RULES}
    return operator, frozenset(POLICY_RULES), vllm


def _refuse_code(code: str) -> str | None:
    operator, safety, vllm = rule_classes()
    if code in operator:
        return None
    if code in vllm:
        return (
            f"is one of vLLM's own start-up checks ({vllm[code][:120]}): vLLM refuses the launch whatever a profile "
            f"says, so a profile cannot change it"
        )
    if code in safety:
        return "is one of Preflight's safety gates (what a launch may load or leave unjudged): fixed, not in profiles"
    return f"is no rule; a profile sets the operators' rules: {', '.join(sorted(operator))}"


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ProfileError(f"{where}: must be a number in (0, 1], not {value!r}")
    return float(value)


def _rule(where: str, code: str, value: Any, base: RulePolicy | None) -> RulePolicy:
    if isinstance(value, str):
        value = {"action": value}
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: must be one of {', '.join(ACTIONS)} or a table with action")
    unknown = sorted(set(value) - {"action", *(THRESHOLD_KEYS if code in THRESHOLDS else ())})
    if unknown:
        allowed = "action, warn_above, refuse_above" if code in THRESHOLDS else "action (this rule has no thresholds)"
        raise ProfileError(f"{where}.{unknown[0]}: unknown key (allowed: {allowed})")
    action = value.get("action", base.action if base else None)
    if action not in ACTIONS:
        raise ProfileError(f"{where}.action: must be one of {', '.join(ACTIONS)}, not {action!r}")
    thresholds = {
        k: _number(f"{where}.{k}", value[k]) if k in value else getattr(base, k, None) for k in THRESHOLD_KEYS
    }
    warn, refuse = thresholds["warn_above"], thresholds["refuse_above"]
    if code in THRESHOLDS:
        if warn is None:
            raise ProfileError(f"{where}.warn_above: required for {code} (the {THRESHOLDS[code]} it warns above)")
        if action == "enforce" and refuse is None:
            raise ProfileError(f"{where}.refuse_above: required with action enforce (the value it refuses above)")
        if refuse is not None and refuse < warn:
            raise ProfileError(f"{where}.refuse_above: {refuse:g} is below warn_above {warn:g}")
        if action != "enforce":
            refuse = None  # read only when enforced
    return RulePolicy(action, warn, refuse)


def parse_profile(data: Any, *, source: str, base: Profile | None = None) -> Profile:
    """A profile from its parsed TOML (``source`` names the file in every message), read over ``base`` (the
    shipped profile; None: ``data`` must itself be complete). ProfileError naming the file and key."""
    if not isinstance(data, dict):
        raise ProfileError(f"policy file {source}: must be a table")
    envs = environments()
    unknown = sorted(set(data) - {"name", "description", *envs})
    if unknown:
        raise ProfileError(
            f"policy file {source}: {unknown[0]}: unknown key (a profile has name, description and one table per "
            f"environment: {', '.join(envs)})"
        )
    name = data.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 128 or not name.isprintable():
        raise ProfileError(f"policy file {source}: name: required, 1-128 printable characters (plans record it)")
    if not isinstance(data.get("description", ""), str):
        raise ProfileError(f"policy file {source}: description: must be a string")
    operator = rule_classes()[0]
    out: dict[str, dict[str, RulePolicy]] = {}
    for env in envs:
        table = data.get(env, {})
        if not isinstance(table, dict):
            raise ProfileError(f"policy file {source}: {env}: must be a table of rule = action")
        rules = dict(base.environments[env]) if base else {}
        for code, value in table.items():
            problem = _refuse_code(code)
            if problem:
                raise ProfileError(f"policy file {source}: {env}.{code}: {problem}")
            rules[code] = _rule(f"policy file {source}: {env}.{code}", code, value, rules.get(code))
        missing = sorted(operator - set(rules))
        if missing:
            raise ProfileError(
                f"policy file {source}: {env}.{missing[0]}: missing (a complete profile sets every rule)"
            )
        out[env] = rules
    return Profile(name, out)


def read_profile(text: str | bytes, *, source: str, base: Profile | None = None) -> Profile:
    """A profile from TOML text (bounded: at most 64 KiB)."""
    if len(text) > MAX_PROFILE_BYTES:
        raise ProfileError(f"policy file {source}: larger than {MAX_PROFILE_BYTES} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise ProfileError(f"policy file {source}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"policy file {source}: not TOML: {exc}") from None
    except RecursionError:
        raise ProfileError(f"policy file {source}: not TOML: nested too deeply") from None
    return parse_profile(data, source=source, base=base)


@cache
def default_profile() -> Profile:
    """The shipped profile (service/data/policy/default.toml), complete by itself."""
    return read_profile(DEFAULT_FILE.read_bytes(), source=str(DEFAULT_FILE))


def load_profile(path: pathlib.Path) -> Profile:
    """An operator's profile file read over the shipped one; ProfileError naming the file (and key)."""
    try:
        # O_NONBLOCK: a FIFO named as the profile must not hang the service's start; only a regular file is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ProfileError(f"policy file {path}: not a regular file")
            raw = fh.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"policy file {path}: cannot be read: {exc.strerror or exc}") from None
    return read_profile(raw, source=str(path), base=default_profile())
