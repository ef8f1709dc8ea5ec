"""The step cache's setting (`--cache off|fbcache[:THRESHOLD]`), apart from the cache itself (dit.cache) so
that the command lines and the API check it without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("off", "fbcache")
# bench/quality.py, tiny model at 32 steps: 39 % of evaluations skipped, the detector score unchanged
DEFAULT_THRESHOLD = 0.08


@dataclass(frozen=True)
class CacheConfig:
    policy: str = "off"  # off | fbcache
    threshold: float = DEFAULT_THRESHOLD  # relative L1 change of the first block's residual that still skips

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= 1:
            raise ValueError(f"cache threshold must be a number between 0 and 1, got {t!r}")

    @classmethod
    def parse(cls, text: str | None) -> CacheConfig:
        """ "off", "fbcache" or "fbcache:0.08" (the command line's and the environment's form)."""
        if not text:
            return cls()
        policy, _, threshold = text.partition(":")
        if not threshold:
            return cls(policy)
        try:
            value = float(threshold)
        except ValueError:
            raise ValueError(f"cache must be POLICY[:THRESHOLD], e.g. fbcache:0.1; got {text!r}") from None
        return cls(policy, value)

    @property
    def enabled(self) -> bool:
        return self.policy != "off"

    def __str__(self) -> str:
        return self.policy if not self.enabled else f"{self.policy}:{self.threshold:g}"
