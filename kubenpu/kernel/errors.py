"""The kernel side's one error type."""


class ProbeError(Exception):
    """The probe could not be loaded, attached or read; the message is one line for the operator."""
