"""Event models (the bus contracts) and their JSON Schema export."""

from shared.events.models import *  # noqa: F403
from shared.events.models import __all__  # noqa: F401
