"""The step cache's setting (`--cache off|fbcache[:THRESHOLD]`), apart from the cache itself (dit.cache) so
that the command lines and the API check it without importing torch."""

from __future__ import annotations

import re
from dataclasses import dataclass

POLICIES = ("off", "fbcache")
# bench/quality.py, tiny model at 32 steps: 39 % of evaluations skipped, the detector score unchanged
DEFAULT_THRESHOLD = 0.08
# The setting as text, wherever it is given (flags, variables, the API's field and its OpenAPI pattern): a
# threshold from 0 to 1 in at most 6 decimals, so a request and the command line take the same settings
PATTERN = r"^(off|fbcache(:(0(\.[0-9]{1,6})?|1(\.0{1,6})?|\.[0-9]{1,6}))?)$"  # off takes no threshold
RULE = (
    "cache must be off, fbcache, or fbcache:THRESHOLD with a threshold from 0 to 1 in at most 6 decimals "
    "(e.g. fbcache:0.05)"
)


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
        """ "off", "fbcache" or "fbcache:0.08" (`PATTERN`; ValueError saying `RULE` otherwise); None: off."""
        if text is None:
            return cls()
        if not isinstance(text, str) or not re.fullmatch(PATTERN, text):  # a number: a string was meant
            raise ValueError(f"{RULE}, got {text!r}")
        policy, _, threshold = text.partition(":")
        return cls(policy, float(threshold)) if threshold else cls(policy)

    @staticmethod
    def checked(text: str) -> str:
        """`text` as written once `parse` takes it (a checkpoint's key holds the setting so)."""
        CacheConfig.parse(text)
        return text

    @property
    def enabled(self) -> bool:
        return self.policy != "off"

    def __str__(self) -> str:
        return self.policy if not self.enabled else f"{self.policy}:{self.threshold:g}"
