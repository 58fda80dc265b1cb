"""The old import path of program harnesses: the base class is the authoring API's `vf.harness.Harness`;
what drives a program is vf.episode.program, harness ids vf.episode.harnesses. Not part of the
authoring API."""

from vf.episode.harnesses import build_program_harness, harness_class  # noqa: F401
from vf.episode.program import ProgramDriver, ProgramSeat, RunInterception, flat_tools_to_functions  # noqa: F401
from vf.harness import Harness  # noqa: F401
