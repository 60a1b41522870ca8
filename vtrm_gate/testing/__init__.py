"""pytest plugin shipped with vtrm_gate: a real Redis server, a real local chat-completions
server, a seeded simulated world and an outcome-table ``infer``. Enable with
``pytest_plugins = ["vtrm_gate.testing"]``."""

from __future__ import annotations

from .chat import ChatServer as ChatServer
from .chat import Fault as Fault
from .chat import chat_server as chat_server
from .cluster import ClusterTarget as ClusterTarget
from .cluster import redis_cluster as redis_cluster
from .cluster import redis_cluster_session as redis_cluster_session
from .llama import LlamaServer as LlamaServer
from .llama import RecordingProxy as RecordingProxy
from .llama import llama_server as llama_server
from .outcomes import OutcomeTable as OutcomeTable
from .outcomes import outcome_table as outcome_table
from .redis import RedisTarget, fresh_redis_server, redis_server, redis_target, redis_url
from .redis import redis7_executable as redis7_executable
from .redis import redis7_server as redis7_server
from .redis import redis7_target as redis7_target
from .sim import SMALL_POOLS as SMALL_POOLS
from .sim import sim_world as sim_world
from .sim import train_small_workspace as train_small_workspace
from .sim import trained_workspace as trained_workspace

__all__ = [
    "SMALL_POOLS",
    "ChatServer",
    "ClusterTarget",
    "Fault",
    "LlamaServer",
    "OutcomeTable",
    "RecordingProxy",
    "RedisTarget",
    "chat_server",
    "fresh_redis_server",
    "llama_server",
    "outcome_table",
    "redis7_executable",
    "redis7_server",
    "redis7_target",
    "redis_cluster",
    "redis_cluster_session",
    "redis_server",
    "redis_target",
    "redis_url",
    "sim_world",
    "train_small_workspace",
    "trained_workspace",
]
