"""The reference PIT module under the name users validate (`pitcheck validate pitcheck.nn:make`); the code
is pitcheck/model/nn.py, in the layer that sources and verbs import it from."""
from .model.nn import HALF, PIT, PROJECTIVE, checked_ids, lower_factor, make, memory_as_used  # noqa: F401
