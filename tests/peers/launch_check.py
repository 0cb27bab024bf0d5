#!/usr/bin/env python3
"""Evaluates a launch file without a ROS install and prints the command lines it would run
(one JSON list per line): `launch_check.py FILE [name:=value ...]`.

* XML (`.launch.xml`): parsed with Python's XML parser; `<arg>` defaults, `$(var ...)` and
  `$(eval '...')` substitutions and the `if` / `unless` attributes of `<executable>` evaluated
  as ros2 launch's XML front end does.
* Python (`.launch.py`): `generate_launch_description()` run against stand-ins for the launch
  API it uses (LaunchDescription, DeclareLaunchArgument, ExecuteProcess, IfCondition,
  UnlessCondition, LaunchConfiguration, PythonExpression) with their constructors' signatures,
  the substitutions performed with the given arguments.
An unknown argument, an undeclared variable, or an API the file uses that is not there fails.
"""

import json
import re
import sys
import types
import xml.etree.ElementTree as ET


def bool_of(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1"):
        return True
    if t in ("false", "0"):
        return False
    raise SystemExit(f"condition {text!r} is neither true nor false")


def xml_commands(path: str, given: dict) -> list:
    root = ET.parse(path).getroot()
    assert root.tag == "launch", root.tag
    args = {}
    for a in root.iter("arg"):
        args[a.get("name")] = given.pop(a.get("name"), a.get("default"))
    if given:
        raise SystemExit(f"not declared: {sorted(given)}")

    def sub(text: str) -> str:
        def var(m):
            if m.group(1) not in args or args[m.group(1)] is None:
                raise SystemExit(f"$(var {m.group(1)}) is not declared")
            return args[m.group(1)]

        text = re.sub(r"\$\(var ([\w]+)\)", var, text)
        return re.sub(r"\$\(eval '(.*?)'\)", lambda m: str(eval(m.group(1), {}, {})).lower(), text)

    out = []
    for e in root:
        if e.tag == "arg":
            continue
        if e.tag != "executable":
            raise SystemExit(f"<{e.tag}> is not evaluated here")
        if e.get("if") is not None and not bool_of(sub(e.get("if"))):
            continue
        if e.get("unless") is not None and bool_of(sub(e.get("unless"))):
            continue
        out.append(sub(e.get("cmd")).split())
    return out


class Context:
    def __init__(self, args):
        self.args = args


def resolve(x, ctx):
    if isinstance(x, (list, tuple)):
        return "".join(resolve(p, ctx) for p in x)
    if isinstance(x, str):
        return x
    return x.perform(ctx)


def stand_ins():
    launch = types.ModuleType("launch")
    actions = types.ModuleType("launch.actions")
    conditions = types.ModuleType("launch.conditions")
    substitutions = types.ModuleType("launch.substitutions")

    class LaunchDescription:
        def __init__(self, initial_entities=None):
            self.entities = list(initial_entities or [])

    class DeclareLaunchArgument:
        def __init__(self, name, *, default_value=None, description=None, choices=None):
            self.name, self.default_value = name, default_value

    class ExecuteProcess:
        def __init__(self, *, cmd, condition=None, output=None, sigterm_timeout=None, name=None,
                     cwd=None, env=None, additional_env=None, shell=False):
            self.cmd, self.condition = cmd, condition

    class LaunchConfiguration:
        def __init__(self, variable_name, *, default=None):
            self.name = variable_name

        def perform(self, ctx):
            if self.name not in ctx.args:
                raise SystemExit(f"LaunchConfiguration({self.name!r}) is not declared")
            return ctx.args[self.name]

    class PythonExpression:
        def __init__(self, expression):
            self.expression = expression

        def perform(self, ctx):
            return str(eval(resolve(self.expression, ctx), {}, {}))

    class IfCondition:
        def __init__(self, predicate_expression):
            self.p = predicate_expression

        def evaluate(self, ctx):
            return bool_of(resolve(self.p, ctx))

    class UnlessCondition(IfCondition):
        def evaluate(self, ctx):
            return not super().evaluate(ctx)

    launch.LaunchDescription = LaunchDescription
    actions.DeclareLaunchArgument = DeclareLaunchArgument
    actions.ExecuteProcess = ExecuteProcess
    conditions.IfCondition, conditions.UnlessCondition = IfCondition, UnlessCondition
    substitutions.LaunchConfiguration = LaunchConfiguration
    substitutions.PythonExpression = PythonExpression
    launch.actions, launch.conditions, launch.substitutions = actions, conditions, substitutions
    for name, m in [("launch", launch), ("launch.actions", actions), ("launch.conditions", conditions),
                    ("launch.substitutions", substitutions)]:
        sys.modules[name] = m
    return DeclareLaunchArgument, ExecuteProcess


def py_commands(path: str, given: dict) -> list:
    Declare, Execute = stand_ins()
    module = types.ModuleType("launch_file")
    module.__file__ = path
    exec(compile(open(path).read(), path, "exec"), module.__dict__)
    ld = module.generate_launch_description()
    args = {}
    for e in ld.entities:
        if isinstance(e, Declare):
            args[e.name] = given.pop(e.name, e.default_value)
    if given:
        raise SystemExit(f"not declared: {sorted(given)}")
    ctx = Context(args)
    out = []
    for e in ld.entities:
        if isinstance(e, Execute) and (e.condition is None or e.condition.evaluate(ctx)):
            out.append([resolve(p, ctx) for p in e.cmd])
    return out


def main():
    path, rest = sys.argv[1], sys.argv[2:]
    given = dict(a.split(":=", 1) for a in rest)
    cmds = xml_commands(path, given) if path.endswith(".xml") else py_commands(path, given)
    for c in cmds:
        print(json.dumps(c))


if __name__ == "__main__":
    main()
