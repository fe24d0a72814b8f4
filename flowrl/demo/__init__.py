"""The example agent and `flowrl demo`: they use the library; nothing but the CLI imports them."""
