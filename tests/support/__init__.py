"""What the tests share, a module a job.

    trees      definition trees on disk: write_tree, write_atomic, the gated and versioned trees
    servers    a real Corral on loopback: corral_server (in process), ServerProcess (`corral serve`)
    client     a conversation over the HTTP API: Conversation, talk
    events     server-sent events: sse, read_events, ended, named, and waits on /v1/events
    swaps      the served definition set, reloads and the swap history; watcher_live
    processes  alive, and wait_until a condition, with a bound
    durable    servers that die and come back (Node), a conversation followed across them (Follower)
    fake_models the fake model servers a module shares (Fakes), and a client that checks their scripts ran

Fixtures stay in tests/conftest.py, where pytest finds them; no test imports it as a module.
"""
