"""The verification harness: adapters, the paired scheduler driver, invariants, the state machine."""
