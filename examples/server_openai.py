"""The openai SDK against `inferscale serve`: Caroline's facts answered from injected KV.

Start the server first, in another terminal (`small` is the real 0.5B model, or a model folder):
    inferscale serve --model small --port 8000
then:
    python examples/server_openai.py --base-url http://127.0.0.1:8000
The user goes in the OpenAI field `user` (or the X-User-Id header); memory options go in
extra_body={"memory": {...}}. The response's `memory` field and X-InferScale-* headers say
which facts were injected.
"""

from __future__ import annotations

from openai import OpenAI
from server_setup import USER_ID, parse_args, remember_demo_facts

from inferscale_integrations.client import api_url, resolve_api_key


def main(base_url: str, api_key: str | None = None, user_id: str = USER_ID,
         max_tokens: int = 48) -> dict:
    remember_demo_facts(base_url, api_key, user_id)
    client = OpenAI(base_url=api_url(base_url), api_key=resolve_api_key(api_key) or "no-key")
    model = client.models.list().data[0].id

    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "What is the name of Caroline's dog?"}],
        user=user_id, extra_body={"memory": {"k": 4}}, max_tokens=max_tokens, temperature=0)
    completion = raw.parse()
    answer = completion.choices[0].message.content

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Where do I live?"}],
        user=user_id, max_tokens=max_tokens, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream
                       if chunk.choices)
    return {"answers": [answer, streamed], "memory": completion.model_extra["memory"],
            "injected_tokens": [int(raw.headers["x-inferscale-injected-tokens"]),
                                int(stream.response.headers["x-inferscale-injected-tokens"])]}


if __name__ == "__main__":
    args = parse_args(__doc__)
    result = main(args.base_url, args.api_key, args.user, args.max_tokens)
    for answer in result["answers"]:
        print("AI:", answer.strip())
    print("memory:", result["memory"])
    print("injected tokens per answer:", result["injected_tokens"])
