"""The built-in skill tools: `activate_skill` and `read_skill_resource`.

The model sees every skill's name and description in its instructions;
activating one returns its body and the list of its files; reading a
resource returns one file of the skill's folder and nothing outside it
(no `..`, no absolute path, no symlink out), and only a file whose content
still matches the digest the definitions were compiled with. Both only read,
so a call cut off by a crash is simply made again (`replay_safe`). Only regular
files are opened (`sources.read_regular`): a FIFO planted in the folder is a
tool error, not a turn stuck on an open that waits for a writer.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..canonical import freeze
from ..compiler.definitions import SkillDefinition
from ..compiler.sources import read_regular
from ..deployment.vault import FileChanged
from ..messages import ToolSpec
from .base import ToolContext, ToolOutput, cap_output

ACTIVATE = "activate_skill"
READ = "read_skill_resource"


def skills_prompt(skills: list[SkillDefinition]) -> str:
    lines = [f"- {s.name}: {s.description or '(no description)'}" for s in skills]
    return (
        "\n\nYou have these skills. Call `activate_skill` with a skill's name to read its "
        "instructions before using it:\n" + "\n".join(lines)
    )


class ActivateSkill:
    replay_safe = True  # read-only

    def __init__(self, skills: list[SkillDefinition]):
        self.skills = {s.name: s for s in skills}
        self.spec = ToolSpec(
            name=ACTIVATE,
            description="Load a skill's instructions and the list of its resource files.",
            input_schema=freeze({
                "type": "object",
                "properties": {"name": {"type": "string", "enum": sorted(self.skills)}},
                "required": ["name"],
            }),
        )

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        skill = self.skills[arguments["name"]]
        resources = sorted(p for p in skill.files if p != "SKILL.md")
        listing = "\n".join(f"- {p}" for p in resources)
        suffix = f"\n\nResources (read with `{READ}`):\n{listing}" if resources else ""
        return ToolOutput(skill.instructions + suffix)


class ReadSkillResource:
    replay_safe = True  # read-only

    def __init__(self, skills: list[SkillDefinition]):
        self.skills = {s.name: s for s in skills}
        self.spec = ToolSpec(
            name=READ,
            description="Read one file of a skill's folder, by its path inside the folder.",
            input_schema=freeze({
                "type": "object",
                "properties": {
                    "skill": {"type": "string", "enum": sorted(self.skills)},
                    "path": {"type": "string", "description": "e.g. reference/forms.md"},
                },
                "required": ["skill", "path"],
            }),
        )

    async def call(self, arguments: Mapping[str, Any], ctx: ToolContext) -> ToolOutput:
        skill = self.skills[arguments["skill"]]
        written = str(arguments["path"])
        if skill.folder is None:
            return self._from_vault(skill, written, ctx)
        path = _inside(skill.folder, written)
        if path is None:
            return ToolOutput(f"{written!r} is outside the skill's folder", is_error=True)
        rel = path.relative_to(skill.folder.resolve()).as_posix()
        expected = skill.files.get(rel)
        if expected is None or path.is_dir():
            return ToolOutput(f"skill {skill.name} has no file {written!r}", is_error=True)
        try:  # the content the skill was compiled with, even if the file changed since
            data = ctx.files.read(skill.folder.resolve(), rel, expected)
        except FileChanged as exc:
            return ToolOutput(str(exc), is_error=True)
        return ToolOutput(cap_output(data))

    @staticmethod
    def _from_vault(skill: SkillDefinition, written: str, ctx: ToolContext) -> ToolOutput:
        """A skill rebuilt from the store (a pin served before a restart): its files by digest only."""
        if not skill.files:
            return ToolOutput(f"skill {skill.name} has no folder of resources", is_error=True)
        rel = posixpath.normpath(written)
        digest = skill.files.get(rel)
        kept = ctx.files.kept(rel, digest) if digest and not rel.startswith(("/", "..")) else None
        if kept is None:
            return ToolOutput(f"skill {skill.name} has no file {written!r}", is_error=True)
        try:
            return ToolOutput(cap_output(read_regular(kept)))
        except OSError as exc:
            return ToolOutput(f"skill {skill.name}: cannot read {written!r}: {exc.strerror}", is_error=True)


def _inside(folder: Path, written: str) -> Path | None:
    if Path(written).is_absolute() or "\0" in written:
        return None
    base = folder.resolve()
    path = (base / written).resolve()
    return path if base in path.parents else None
