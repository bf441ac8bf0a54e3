"""A hierarchical, thread-safe step counter (Acme's ``Counter``).

Counts live in the root; a child counter adds its prefix, so ``Counter(root, "actor")
.increment(steps=5)`` adds 5 to the root's ``actor_steps``. The root is checkpointed with the run.
"""

from __future__ import annotations

import threading


class Counter:
    def __init__(self, parent: Counter | None = None, prefix: str = ""):
        self.parent, self.prefix = parent, prefix
        self._counts: dict[str, float] = {}
        self._lock = threading.Lock()

    def _key(self, key: str) -> str:
        return f"{self.prefix}_{key}" if self.prefix else key

    def increment(self, **counts: float) -> dict[str, float]:
        named = {self._key(k): v for k, v in counts.items()}
        if self.parent is not None:
            return self.parent.increment(**named)
        with self._lock:
            for k, v in named.items():
                self._counts[k] = self._counts.get(k, 0) + v
            return dict(self._counts)

    def set(self, **values: float) -> None:
        named = {self._key(k): v for k, v in values.items()}
        if self.parent is not None:
            self.parent.set(**named)
            return
        with self._lock:
            self._counts.update(named)

    def get_counts(self) -> dict[str, float]:
        if self.parent is not None:
            return self.parent.get_counts()
        with self._lock:
            return dict(self._counts)

    def state_dict(self) -> dict[str, float]:
        return self.get_counts()

    def load_state_dict(self, state: dict[str, float]) -> None:
        with self._lock:
            self._counts = dict(state)
