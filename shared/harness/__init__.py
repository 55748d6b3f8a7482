"""Harness integrations: pure payload mappers (``base.HookMapper``) per agent harness."""
