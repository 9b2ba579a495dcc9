"""Placeholder: built by a later issue (see ../shared/ARCHITECTURE.md)."""
