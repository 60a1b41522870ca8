"""Redis reuse (SPEC §5): every LLM call cached, so a crashed step re-runs at near-zero cost.

- `_keys`: content-addressed keys (model, base URL, messages, params, salt), miss explanations
- `_response`: `ResponseCache` (single flight, fail-open when Redis is down, counters per run)
- `_infer`: `cached_infer`, any ``infer`` behind the cache
- `_connect`, `_cluster`: clients (standalone, Redis Cluster) with short timeouts
- `_embedded`: a real ``redis-server`` on a unix socket inside the workspace (the default)
- `_renew`: TTL renewal and key statistics for ``vtrm-gate cache``

Light at import (no numpy): ``vtrm-gate cache renew`` starts fast.
"""

from __future__ import annotations

from .._env import DEFAULT_TTL as DEFAULT_TTL
from .._env import REDIS_SCHEMES as REDIS_SCHEMES
from .._env import cache_enabled as cache_enabled
from .._env import check_redis_url as check_redis_url
from .._env import environment as environment
from .._env import mask_url as mask_url
from .._env import parse_ttl as parse_ttl
from .._env import read_dotenv as read_dotenv
from .._env import scrub as scrub
from .._env import scrub_credentials as scrub_credentials
from ._cluster import by_slot as by_slot
from ._cluster import is_cluster_url as is_cluster_url
from ._connect import check_redis_access as check_redis_access
from ._connect import connect as connect
from ._embedded import EmbeddedRedis as EmbeddedRedis
from ._embedded import RedisServer as RedisServer
from ._embedded import embedded_server as embedded_server
from ._embedded import find_redis_server as find_redis_server
from ._embedded import stop_embedded as stop_embedded
from ._infer import CachedInfer as CachedInfer
from ._infer import cached_infer as cached_infer
from ._keys import DEFAULT_PREFIX as DEFAULT_PREFIX
from ._keys import RUN_HEADER as RUN_HEADER
from ._keys import SCHEMA_VERSION as SCHEMA_VERSION
from ._keys import KeyParts as KeyParts
from ._keys import MissExplanation as MissExplanation
from ._keys import cache_namespace as cache_namespace
from ._keys import explain_miss as explain_miss
from ._keys import header_run_id as header_run_id
from ._keys import message_text as message_text
from ._keys import protocol_failure as protocol_failure
from ._keys import run_header as run_header
from ._keys import salt_for_run as salt_for_run
from ._keys import tool_calls as tool_calls
from ._keys import validate_response as validate_response
from ._renew import DEFAULT_RENEW_METHOD as DEFAULT_RENEW_METHOD
from ._renew import RENEW_METHODS as RENEW_METHODS
from ._renew import KeyStats as KeyStats
from ._renew import RenewProgress as RenewProgress
from ._renew import RenewReport as RenewReport
from ._renew import cache_stats as cache_stats
from ._renew import renew_ttl as renew_ttl
from ._renew import server_version as server_version
from ._response import CacheResult as CacheResult
from ._response import CacheStats as CacheStats
from ._response import ResponseCache as ResponseCache

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_RENEW_METHOD",
    "DEFAULT_TTL",
    "REDIS_SCHEMES",
    "RENEW_METHODS",
    "RUN_HEADER",
    "SCHEMA_VERSION",
    "CacheResult",
    "CacheStats",
    "CachedInfer",
    "EmbeddedRedis",
    "KeyParts",
    "KeyStats",
    "MissExplanation",
    "RedisServer",
    "RenewProgress",
    "RenewReport",
    "ResponseCache",
    "by_slot",
    "cache_enabled",
    "cache_namespace",
    "cache_stats",
    "cached_infer",
    "check_redis_access",
    "check_redis_url",
    "connect",
    "embedded_server",
    "environment",
    "explain_miss",
    "find_redis_server",
    "header_run_id",
    "is_cluster_url",
    "mask_url",
    "message_text",
    "parse_ttl",
    "protocol_failure",
    "read_dotenv",
    "renew_ttl",
    "run_header",
    "salt_for_run",
    "scrub",
    "scrub_credentials",
    "server_version",
    "stop_embedded",
    "tool_calls",
    "validate_response",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
