"""Tools an agent can call: one port (`base.ToolPort`), one module per kind.

`command` runs an argv without a shell, `http` makes one HTTP request,
`subagent` runs another agent's turn, `skills` serves skill bodies and files.
`toolbox` builds the set of tools a turn may call from an agent's closure.
"""
