"""A small verifiers v1 environment for rlrun's tests: reverse a string of lowercase letters.

An ordinary verifiers env package (the layout `vf-init` scaffolds): a Taskset whose Task
scores with a `@vf.reward`, plus an in-process chat Harness (one model call through the
interception endpoint, no program launched, so nothing is installed or downloaded). It is
found the way verifiers finds tasksets: the module `vf_reverse_text` on the path, exporting
its Taskset (and Harness) through `__all__`.
"""

from vf_reverse_text.harness import ChatHarness
from vf_reverse_text.taskset import ReverseTaskset

__all__ = ["ChatHarness", "ReverseTaskset"]
