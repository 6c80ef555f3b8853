"""The varied corpus generator's parts (issue 15); the command is ``sample_logs/make_varied_corpus.py``."""
