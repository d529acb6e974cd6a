"""Routing engine calls over replicas by prefix cache and load (issue 32): see router.py."""

from .policies import DEFAULT_BALANCE_ABS, DEFAULT_BALANCE_REL, DEFAULT_POLICY, POLICIES
from .pool import ReplicaPool
from .router import RoutedEngine, Router, RoutingConfig

__all__ = ["DEFAULT_BALANCE_ABS", "DEFAULT_BALANCE_REL", "DEFAULT_POLICY", "POLICIES", "ReplicaPool",
           "RoutedEngine", "Router", "RoutingConfig"]
