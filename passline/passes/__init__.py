"""Built-in passes, one per module. Importing this package registers them."""
from . import dce  # noqa: F401
