"""The command line: the composition root that builds a server from its config, or runs a
client tool, and the only package allowed to import both gateway/ and clients/."""
