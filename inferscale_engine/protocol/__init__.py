"""The protocol: what crosses from the app to vLLM's processes.

wire.py       version, field parsers, packed ids, MACs
plan.py       InjectionPlan (read path) and from_params
save_plan.py  SavePlan (write path)
handoff.py    in-process plans handed over by reference
tier_control.py  moves between the KV tiers and disk entries (collective_rpc), the disk naming
              rule
"""
