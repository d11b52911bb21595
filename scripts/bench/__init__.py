"""Every benchmark and measurement, one command: `python -m scripts.bench QUESTION` (__main__.py
names the questions and the module answering each). README.md says which file answers which
question and which files are libraries for the others."""
