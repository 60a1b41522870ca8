"""Real agents (SPEC §6): the OpenAI-compatible chat agent and evolver, several endpoints,
video frames, LLM workspaces, and your own agent (bring-your-own backends).

- `_agent`: `LLMAgent` (retries, deadlines, the response cache), `MCQ`
- `_replies`: `parse_choice`, a reply's text, an error body's message, a context overflow
- `_limit`: `GradientLimit`, the adaptive concurrency of one endpoint
- `_evolver`: `LLMEvolver` (candidate skill texts through the same endpoint and cache)
- `_endpoints`: `EndpointPool` (per-endpoint caps, least-loaded routing, down and back)
- `_media`: frames as content parts, resolved to ``data:`` URIs on the way out
- `_workspace`: `init_llm` and the validation of an llm workspace's agent settings
- `_backend`: `llm_backend` (agent + evolver + rollout on one cache), `rollout_cases`
- `_plugin`: `AgentBackend`, `BackendContext`, factories named ``package.module:function``
- `_client`: `cached_http_client`, an httpx client whose chat calls go through the cache
- `_tools`: `ToolAgent`, a multi-step function-calling agent on the cached client
"""

from __future__ import annotations

from ..errors import BackendError as BackendError
from ..errors import ContextOverflowError as ContextOverflowError
from ..errors import EndpointsError as EndpointsError
from ..errors import EndpointUnreachableError as EndpointUnreachableError
from ..errors import EvolveError as EvolveError
from ..errors import LLMInfraError as LLMInfraError
from ..errors import MediaChangedError as MediaChangedError
from ..errors import PromptFilteredError as PromptFilteredError
from ..gate import current_run_id as current_run_id
from ..gate import run_scope as run_scope
from ._agent import AGENT_VERSION as AGENT_VERSION
from ._agent import ANSWER_PROMPT as ANSWER_PROMPT
from ._agent import DEFAULT_BASE_URL as DEFAULT_BASE_URL
from ._agent import DEFAULT_MAX_TOKENS as DEFAULT_MAX_TOKENS
from ._agent import MCQ as MCQ
from ._agent import SYSTEM_PREAMBLE as SYSTEM_PREAMBLE
from ._agent import TEXT_TASK as TEXT_TASK
from ._agent import THINK_PROMPT as THINK_PROMPT
from ._agent import VIDEO_TASK as VIDEO_TASK
from ._agent import AgentEvent as AgentEvent
from ._agent import AgentSettings as AgentSettings
from ._agent import LLMAgent as LLMAgent
from ._agent import RetryPolicy as RetryPolicy
from ._agent import parse_body as parse_body
from ._agent import parse_retry_after as parse_retry_after
from ._agent import system_preamble as system_preamble
from ._backend import PROBE_TIMEOUT_S as PROBE_TIMEOUT_S
from ._backend import ROLLOUT_UNITS as ROLLOUT_UNITS
from ._backend import LLMBackend as LLMBackend
from ._backend import Rollout as Rollout
from ._backend import check_endpoint as check_endpoint
from ._backend import endpoint_pool as endpoint_pool
from ._backend import llm_backend as llm_backend
from ._backend import probe_endpoint as probe_endpoint
from ._backend import rollout_cases as rollout_cases
from ._backend import workspace_units as workspace_units
from ._client import CachedTransport as CachedTransport
from ._client import cached_http_client as cached_http_client
from ._endpoints import DEFAULT_CAP as DEFAULT_CAP
from ._endpoints import Endpoint as Endpoint
from ._endpoints import EndpointPool as EndpointPool
from ._endpoints import EndpointStats as EndpointStats
from ._endpoints import Exchange as Exchange
from ._endpoints import ShardedClient as ShardedClient
from ._endpoints import agent_endpoints as agent_endpoints
from ._endpoints import check_endpoints_setting as check_endpoints_setting
from ._endpoints import endpoint_lines as endpoint_lines
from ._endpoints import gate_concurrency as gate_concurrency
from ._endpoints import parse_endpoints as parse_endpoints
from ._endpoints import read_endpoints_file as read_endpoints_file
from ._evolver import EVOLVE_PREFIX as EVOLVE_PREFIX
from ._evolver import EVOLVE_SYSTEM as EVOLVE_SYSTEM
from ._evolver import EVOLVE_TASK as EVOLVE_TASK
from ._evolver import ErrorCase as ErrorCase
from ._evolver import LLMEvolver as LLMEvolver
from ._evolver import evolve_system as evolve_system
from ._evolver import strip_fences as strip_fences
from ._limit import GradientLimit as GradientLimit
from ._limit import LimitParams as LimitParams
from ._media import MediaResolver as MediaResolver
from ._media import data_uri as data_uri
from ._plugin import MAX_TEXT_CHARS as MAX_TEXT_CHARS
from ._plugin import MAX_TRACE_CHARS as MAX_TRACE_CHARS
from ._plugin import AgentBackend as AgentBackend
from ._plugin import BackendContext as BackendContext
from ._plugin import BackendFactory as BackendFactory
from ._plugin import RolloutSource as RolloutSource
from ._plugin import is_factory_spec as is_factory_spec
from ._plugin import load_factory as load_factory
from ._plugin import make_backend as make_backend
from ._plugin import open_factory_backend as open_factory_backend
from ._plugin import with_identity as with_identity
from ._replies import LETTERS as LETTERS
from ._replies import parse_choice as parse_choice
from ._tools import ANSWER_NUDGE as ANSWER_NUDGE
from ._tools import TOOL_AGENT_VERSION as TOOL_AGENT_VERSION
from ._tools import ToolAgent as ToolAgent
from ._tools import ToolEvolver as ToolEvolver
from ._tools import content_parts as content_parts
from ._tools import tool_backend as tool_backend
from ._tools import tool_schemas as tool_schemas
from ._workspace import check_llm_agent as check_llm_agent
from ._workspace import default_llm_skill as default_llm_skill
from ._workspace import init_llm as init_llm

__all__ = [
    "AGENT_VERSION",
    "ANSWER_NUDGE",
    "ANSWER_PROMPT",
    "DEFAULT_BASE_URL",
    "DEFAULT_CAP",
    "DEFAULT_MAX_TOKENS",
    "EVOLVE_PREFIX",
    "EVOLVE_SYSTEM",
    "EVOLVE_TASK",
    "LETTERS",
    "MAX_TEXT_CHARS",
    "MAX_TRACE_CHARS",
    "MCQ",
    "PROBE_TIMEOUT_S",
    "ROLLOUT_UNITS",
    "SYSTEM_PREAMBLE",
    "TEXT_TASK",
    "THINK_PROMPT",
    "TOOL_AGENT_VERSION",
    "VIDEO_TASK",
    "AgentBackend",
    "AgentEvent",
    "AgentSettings",
    "BackendContext",
    "BackendError",
    "BackendFactory",
    "CachedTransport",
    "ContextOverflowError",
    "Endpoint",
    "EndpointPool",
    "EndpointStats",
    "EndpointUnreachableError",
    "EndpointsError",
    "ErrorCase",
    "EvolveError",
    "Exchange",
    "GradientLimit",
    "LLMAgent",
    "LLMBackend",
    "LLMEvolver",
    "LLMInfraError",
    "LimitParams",
    "MediaChangedError",
    "MediaResolver",
    "PromptFilteredError",
    "RetryPolicy",
    "Rollout",
    "RolloutSource",
    "ShardedClient",
    "ToolAgent",
    "ToolEvolver",
    "agent_endpoints",
    "cached_http_client",
    "check_endpoint",
    "check_endpoints_setting",
    "check_llm_agent",
    "content_parts",
    "current_run_id",
    "data_uri",
    "default_llm_skill",
    "endpoint_lines",
    "endpoint_pool",
    "evolve_system",
    "gate_concurrency",
    "init_llm",
    "is_factory_spec",
    "llm_backend",
    "load_factory",
    "make_backend",
    "open_factory_backend",
    "parse_body",
    "parse_choice",
    "parse_endpoints",
    "parse_retry_after",
    "probe_endpoint",
    "read_endpoints_file",
    "rollout_cases",
    "run_scope",
    "strip_fences",
    "system_preamble",
    "tool_backend",
    "tool_schemas",
    "with_identity",
    "workspace_units",
]

# below __all__: the classes it names report this namespace as their module
from .._api import declare

declare(__name__, globals())
del declare
