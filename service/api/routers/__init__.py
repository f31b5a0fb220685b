"""One router per API domain (``router = APIRouter()`` in each); ``create_app`` includes them in this order, the
agent's first (the fleet's hot path is matched before any other route)."""
