"""The replicated state machine runtime shared by the user shard and the matcher.

Reading order: `core.state_machine` (the API a service implements),
`core.log_batch` (what one log record holds), `core.replica` (how a replica
applies records), `log_store` (where records live), `sequencer` (how the leader
forms records), `node` (recovery and wiring).
"""
