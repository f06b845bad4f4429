"""Temporary: moved to kubenpu.sources.registry (tests are being ported)."""

from kubenpu.sources.registry import FAMILIES, table

__all__ = ["FAMILIES", "table"]
