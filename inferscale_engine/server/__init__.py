"""`inferscale serve`: vLLM's own OpenAI-compatible server with per-user KV memory.

main.py     the command: vLLM's engine (AsyncLLM) with InferScale's connector, the Memory on
top of it, vLLM's app with the seam installed, our routes, auth and metrics
seam.py     MemoryServingChat / MemoryServingCompletion: vLLM's serving classes whose
render step splices the user's facts in and signs the plan
identity.py who the request is for (header, body, extra_body.memory) and its memory options
auth.py     API keys -> tenant, allowed users, admin; the middleware every route goes through
routes.py   the memory REST API (mem0's shapes); mem0_api.py mem0's own routes (/v3)
transfer_api.py  export and import of a user's memories (/v1/memories/export, /import)
limits.py   request and header size limits, refusals counted
hosts.py    the Host header checks (DNS rebinding)
metrics.py  InferScale's counters on vLLM's /metrics
ui/         the memory inspector (a page and its JSON routes)
mcp_tools.py     the memory verbs as MCP tools (add_memory, search_memories, ...), one user each
mcp_backends.py  what the tools call: a Memory in this process, or a server (MemoryClient)
mcp_http.py      the tools over streamable HTTP at /mcp, behind the keys and identity checks
mcp_stdio.py     `inferscale mcp`: the tools over stdio for one user (embedded or --base-url)
vllm_compat.py  where vLLM 0.26 and 0.32 keep the server pieces
"""
