"""The exporters' one error type: a one-line reason they cannot start (the agent exits 2)."""


class ExportError(Exception):
    """A one-line reason the exporters cannot start; the agent exits 2."""


class PortInUseError(ExportError):
    pass
