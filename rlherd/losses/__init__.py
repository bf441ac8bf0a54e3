"""Losses as pure functions of tensors. Each is tested against a naive reference in tests/."""
