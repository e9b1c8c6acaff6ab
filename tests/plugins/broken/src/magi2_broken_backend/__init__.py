"""Deliberately broken backends (quarantine tests)."""
