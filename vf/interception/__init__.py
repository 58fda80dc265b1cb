"""Interception: agent programs call a local server as their model provider; each call is answered by
the rollout's handler (its policy) in the dialect the agent speaks. See vf.interception.server."""

from vf.interception.server import InterceptionConfig, InterceptionServer, Registration, registration_env

__all__ = ["InterceptionConfig", "InterceptionServer", "Registration", "registration_env"]
