"""The plan protocol: what crosses from the app to vLLM's processes (kv_transfer_params).

wire.py       version, field parsers, packed ids, MACs
plan.py       InjectionPlan (read path) and from_params
save_plan.py  SavePlan (write path)
handoff.py    in-process plans handed over by reference
"""
