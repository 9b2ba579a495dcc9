"""Rollouts through the production runtime, on Ray.

* :mod:`rl.rollout.inference` — the policy's engine in a Ray actor (continuous
  batching across every live rollout, prefix cache, weights version);
* :mod:`rl.rollout.worker` — rollout workers (Ray actors): fork the task's
  workspace, build the session with :func:`agent.runtime.build_session`, run it
  with the token-in/token-out policy, return :class:`rl.types.Rollout` objects;
* :mod:`rl.rollout.log` — the :class:`RolloutLog` protocol the driver persists
  rollouts through (implemented over the session log by ``backend/rl_log.py``).

Importing this package imports neither torch nor ray.
"""
