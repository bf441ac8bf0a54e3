"""Agents, one folder each: config, networks, acting, learning, builder."""

AGENTS = ("impala",)
