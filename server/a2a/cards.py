"""An agent's A2A card: who it is, which digest answers, and where to call it.

`GET /a2a/{ref}/.well-known/agent-card.json`: `version` is the digest the
reference serves (a pinned reference, `name@sha256:…` or `name@alias`,
serves exactly that digest), and the JSON-RPC interface is `/a2a/{ref}`,
listed once for A2A 1.0 and once for 0.3 (one endpoint serves both method
sets; the SDK tells them apart by the `A2A-Version` header). Skills are the
agent's skills, or one skill describing the agent. With API keys set, the
card names a bearer scheme.
"""

from __future__ import annotations

from typing import Any

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0

from ..compiler.definitions import AgentDefinition, Closure, SkillDefinition

PREFIX = "/a2a/"
CARD_SUFFIX = AGENT_CARD_WELL_KNOWN_PATH  # "/.well-known/agent-card.json"
BEARER = "bearer"


def is_card_path(path: str) -> bool:
    """Whether `path` is an agent card's (what `CORRAL_A2A_PUBLIC_CARDS` publishes without a key)."""
    return path.startswith(PREFIX) and path.endswith(CARD_SUFFIX) and path.count("/") == 4


def describe(agent: AgentDefinition) -> str:
    return agent.description or f"The Corral agent {agent.name!r} (model {agent.model})."


def _skills(closure: Closure) -> list[AgentSkill]:
    skills = sorted((d for d in closure.members.values() if isinstance(d, SkillDefinition)),
                    key=lambda s: s.name)
    if skills:
        return [AgentSkill(id=s.name, name=s.name, description=s.description or f"The {s.name} skill.",
                           tags=["skill"]) for s in skills]
    agent = closure.agent
    return [AgentSkill(id=agent.name, name=agent.name, description=describe(agent), tags=["agent"])]


def card(closure: Closure, endpoint: str, *, secured: bool) -> AgentCard:
    """The card of the agent `closure` runs, called at `endpoint` (the absolute URL of `/a2a/{ref}`)."""
    agent = closure.agent
    built = AgentCard(
        name=agent.name, description=describe(agent), version=agent.digest,
        supported_interfaces=[
            AgentInterface(url=endpoint, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0),
            AgentInterface(url=endpoint, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_0_3),
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"],
        skills=_skills(closure),
    )
    if secured:
        built.security_schemes[BEARER].CopyFrom(
            SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer", description="A key of the server's CORRAL_API_KEYS.")))
        built.security_requirements.append(SecurityRequirement(schemes={BEARER: StringList()}))
    return built


def card_json(closure: Closure, endpoint: str, *, secured: bool) -> dict[str, Any]:
    """The card as served: the 1.0 fields, and the 0.3 ones (`url`, `protocolVersion`…) beside them."""
    return agent_card_to_dict(card(closure, endpoint, secured=secured))
