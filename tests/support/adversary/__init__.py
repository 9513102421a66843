"""A randomized adversary against a real server (issue 31): see docs/adversary.md."""
