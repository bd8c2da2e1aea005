"""Print one of the README's set-up commands, so that CI runs exactly what the README says.

Usage: python .ci/readme_command.py try|test
"""
import re
import sys

HEADINGS = {"try": "**Try it**", "test": "**Run the tests:**"}

text = open("README.md", encoding="utf-8").read()
start = text.index(HEADINGS[sys.argv[1]])
match = re.compile(r"```sh\n(.*?)```", re.S).search(text, start)
print(match.group(1).strip())
