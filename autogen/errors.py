"""Exception classes of the engine."""


class AutogenError(Exception):
    """Base class of every error the engine raises itself."""


class CompileError(AutogenError):
    """A kernel could not be generated or compiled."""


class ScheduleError(AutogenError):
    """A graph cannot be laid out as one fused loop nest."""


class TracingError(AutogenError):
    """A custom loss cannot be traced to a static graph (Python control flow on a tensor's value)."""


class UnsupportedOpError(AutogenError):
    """A custom loss uses an op the primitive IR cannot express (raised in strict mode)."""
