"""The memory inspector (/ui) in headless Chromium against a real `inferscale serve` (tiny model).

Sign-in, a tenant's users, a user's memories (KV tier, history, edit, delete, delete all),
search, ask (kv and text side by side), sessions, the server panel; tenant isolation through
the page's URL and its fetch calls, stored text rendered as text, cross-site writes refused.
The tests write the screenshots of docs/inspector.md (docs/img/inspector-*.png).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.server.browser import Page, chromium, require_browser
from tests.server.conftest import auth
from tests.server.process import KEYS

require_browser()

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

POLLS_MS = 60_000
"""How long the panel's own refreshes may take to show before the test gives up: a bound on
waiting, not on speed (it ends as soon as they show)."""

FACTS = [
    "Caroline moved to Lisbon in 2021 and works as a pottery teacher.",
    "Caroline's dog is a beagle named Pepper.",
    "Caroline is allergic to peanuts.",
    "Caroline's sister Melanie lives in Boston and runs marathons.",
    "Caroline started learning the cello last spring.",
]
TURNS = [
    {"role": "user", "content": "I just adopted a beagle, her name is Pepper!"},
    {"role": "assistant", "content": "Congratulations! Pepper is a lovely name for a beagle."},
    {"role": "user", "content": "Remember that I can't eat peanuts."},
    {"role": "assistant", "content": "Noted: no peanuts for you."},
]
XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
"""A fact that would run script if the page ever rendered stored text as HTML."""
XSS_TURN = '<iframe src="javascript:parent.pwned=3"></iframe><b onclick="pwned=4">Pepper</b>'
"""A conversation turn (and the fact it becomes) of the same kind."""


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as launched:
        yield launched


@pytest.fixture()
def ui(server, browser) -> Iterator[Page]:
    page = Page(browser, server.base_url)
    try:
        yield page
    finally:
        errors = list(page.errors)
        page.close()
        assert not errors, errors  # no script error, no alert/confirm/prompt


def _user(tenant: str, name: str) -> str:
    """A readable user id of this run only (the screenshots show it)."""
    return f"{tenant}:{name}-{uuid.uuid4().hex[:4]}"


def _add(http: httpx.Client, tenant: str, user: str, **body) -> list[int]:
    response = http.post("/v1/memories", headers=auth(tenant), json={"user_id": user, **body})
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()["results"]]


def _texts(http: httpx.Client, tenant: str, user: str) -> list[str]:
    response = http.get("/v1/memories", headers=auth(tenant), params={"user_id": user})
    assert response.status_code == 200, response.text
    return [r["memory"] for r in response.json()["results"]]


@pytest.fixture()
def caroline(http) -> str:
    """Tenant a's user with facts and a conversation."""
    user = _user("a", "caroline")
    _add(http, "a", user, texts=FACTS)
    _add(http, "a", user, messages=TURNS, session_id="adoption-chat")
    return user


def test_a_wrong_key_is_refused(ui, http):
    page = ui.page
    response = page.goto("/ui")
    assert response.status == 200
    headers = response.headers
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    page.fill("#signin-key", "sk-not-a-key-of-this-server")
    page.click("#signin-submit")
    error = page.locator("#signin-error")
    error.wait_for()
    assert "Refused (401)" in error.text_content() and "API key" in error.text_content()
    assert page.locator("#users").count() == 0 and page.locator("#tenant").count() == 0
    assert page.evaluate("sessionStorage.getItem('inferscale.key')") is None  # not kept
    ui.shot("signin")
    # The data routes need a key; the page and its files hold no data and need none.
    assert http.get("/ui/api/users").status_code == 401
    assert http.get("/ui/api/whoami", headers={"Authorization": "Bearer sk-wrong-0123456789"}
                    ).status_code == 401
    for path in ("/ui/static/app.js", "/ui/static/style.css", "/ui/static/icon.svg"):
        asset = http.get(path)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff"
    assert http.get("/ui/static/../main.py").status_code in (401, 404)
    assert http.get("/ui/static/index.html").status_code in (401, 404)


def test_a_tenant_lists_only_its_own_users(ui, http):
    tag = uuid.uuid4().hex[:4]
    ours = [f"a:{name}-{tag}" for name in ("caroline", "dave", "erin")]
    theirs = f"b:bob-{tag}"
    for user in ours:
        _add(http, "a", user, texts=[f"{user} likes tea."])
    _add(http, "b", theirs, texts=["Bob collects stamps."])
    page = ui.open(KEYS["a"])
    page.wait_for_selector(f"#users a:text-is('{ours[0]}')")
    listed = page.locator("#users a").all_text_contents()
    assert set(ours) <= set(listed) and theirs not in listed
    assert all(u.startswith("a:") for u in listed), listed
    assert page.text_content("#tenant") == "tenant a" and page.locator("nav a").count() == 1
    page.fill("#user-filter", tag)  # b's user matches the filter too, and is not listed
    page.wait_for_function("n => document.querySelectorAll('#users a').length === n", arg=3)
    assert page.locator("#users a").all_text_contents() == ours
    ui.shot("users")
    admin = Page(ui.context.browser, ui.base_url)
    try:
        admin_page = admin.open(KEYS["admin"])
        admin_page.fill("#user-filter", tag)
        admin_page.wait_for_function("n => document.querySelectorAll('#users a').length === n",
                                     arg=4)
        assert admin_page.locator("nav a", has_text="Server").count() == 1
    finally:
        admin.close()


def test_memories_history_edit_and_delete(ui, http, caroline):
    page = ui.open(KEYS["a"], f"#/user/{caroline}/memories")
    rows = page.locator("table.memories tbody tr[data-id]")
    rows.first.wait_for()
    assert page.text_content("#user-id") == caroline
    texts = [rows.nth(i).locator("td.text").text_content() for i in range(rows.count())]
    assert texts == _texts(http, "a", caroline) and FACTS[1] in texts
    first = rows.filter(has_text=FACTS[1])
    assert "GPU slab" in first.locator("td.kv").text_content()  # encoded when added
    assert int(first.locator("td.num").nth(1).text_content()) > 0  # its tokens
    assert "adoption-chat" in page.locator("table.memories").text_content()  # source session
    first.get_by_role("button", name="History").click()
    page.wait_for_selector("ol.events li")
    assert page.locator("ol.events li").first.text_content().split("  ", 1)[1] == \
        f"ADD: {FACTS[1]}"
    ui.shot("memories")

    fact = int(first.get_attribute("data-id"))
    first.get_by_role("button", name="Edit").click()
    page.fill("textarea.edit-text", "Caroline's dog is a beagle named Biscuit.")
    page.click("button.save")
    page.wait_for_selector("#notice")
    assert f"Memory #{fact} updated" in page.text_content("#notice")
    edited = page.locator(f"table.memories tr[data-id='{fact}'] td.text")
    assert edited.text_content() == "Caroline's dog is a beagle named Biscuit."
    assert "Caroline's dog is a beagle named Biscuit." in _texts(http, "a", caroline)
    assert FACTS[1] not in _texts(http, "a", caroline)

    victim = page.locator("table.memories tr[data-id]", has_text=FACTS[2])
    victim_id = int(victim.get_attribute("data-id"))
    victim.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog#confirm")
    dialog.wait_for()
    assert FACTS[2] in dialog.text_content()
    page.click("#confirm-cancel")  # a cancel deletes nothing
    assert FACTS[2] in _texts(http, "a", caroline)
    victim.get_by_role("button", name="Delete").click()
    page.click("#confirm-ok")
    page.wait_for_function("t => document.querySelector('#notice')?.textContent.includes(t)",
                           arg=f"Memory #{victim_id} deleted")
    assert "ADD → DELETE" in page.text_content("#notice")  # what the delete did
    assert page.locator(f"table.memories tr[data-id='{victim_id}']").count() == 0
    assert FACTS[2] not in _texts(http, "a", caroline)  # gone from the API too
    gone = http.get(f"/v1/memories/{victim_id}", headers=auth("a"))
    assert gone.status_code == 404


def test_search_shows_scores(ui, caroline):
    page = ui.open(KEYS["a"], f"#/user/{caroline}/search")
    page.fill("#search-query", "What pet does Caroline have?")
    page.click("#search-submit")
    rows = page.locator("#search-table tbody tr")
    rows.first.wait_for()
    assert rows.count() >= len(FACTS)  # the facts, and facts of the conversation's turns
    scores = [float(s) for s in page.locator("#search-table td.score").all_text_contents()]
    assert scores == sorted(scores, reverse=True) and all(-1 <= s <= 1 for s in scores)
    signals = page.locator("#search-table td.found-by").all_text_contents()
    assert len(signals) == len(scores) and set(signals) <= {"embedding", "keywords", "both"}
    assert "Pepper" in rows.first.text_content()
    ui.shot("search")


def test_ask_answers_in_kv_and_text_mode(ui, caroline):
    page = ui.open(KEYS["a"], f"#/user/{caroline}/ask")
    page.fill("#ask-question", f"What is the name of Caroline's dog? ({uuid.uuid4().hex[:6]})")
    page.fill("#ask-k", "4")
    page.fill("#ask-max-tokens", "8")
    page.click("#ask-submit")
    page.wait_for_selector("#answer-text")
    facts = page.locator("#ask-facts tbody tr")
    assert facts.count() == 4
    assert all(re.fullmatch(r"-?[01]\.\d{3}", s)
               for s in page.locator("#ask-facts td.score").all_text_contents())
    for mode in ("kv", "text"):
        card = page.locator(f"#answer-{mode}")
        assert re.fullmatch(r"[\d.,]+ ms", card.locator(".ttft").text_content()), mode
        assert card.locator(".answer").text_content().strip(), mode  # the tiny model's babble
    assert int(page.text_content("#answer-kv .injected").replace(",", "")) > 0
    assert page.text_content("#answer-kv .plan") == "inject"
    assert page.text_content("#answer-text .injected") == "0"
    assert page.text_content("#answer-text .plan") == "none"
    ui.shot("ask")


def test_sessions_and_their_turns(ui, caroline):
    page = ui.open(KEYS["a"], f"#/user/{caroline}/sessions")
    page.wait_for_selector("table.turns tbody tr")
    sessions = page.locator("table.sessions tbody tr")
    assert sessions.count() == 1 and "adoption-chat" in sessions.first.text_content()
    assert sessions.first.locator("td.num").text_content() == str(len(TURNS))
    turns = page.locator("table.turns tbody tr")
    assert [turns.nth(i).locator("td.text").text_content() for i in range(turns.count())] == \
        [t["content"] for t in TURNS]
    ui.shot("sessions")


def test_delete_all_asks_for_the_user_id(ui, http, caroline):
    page = ui.open(KEYS["a"], f"#/user/{caroline}/memories")
    page.wait_for_selector("table.memories")
    count = len(_texts(http, "a", caroline))
    page.click("#delete-all")
    page.wait_for_selector("dialog#confirm[open]")
    assert page.is_disabled("#confirm-ok")  # until the user id is typed
    page.fill("#confirm-typed", caroline[:-1])
    assert page.is_disabled("#confirm-ok")
    page.fill("#confirm-typed", caroline)
    ui.shot("delete-all")
    page.click("#confirm-ok")
    page.wait_for_function("t => document.querySelector('#notice')?.textContent === t",
                           arg=f"Deleted {count} memories.")
    assert _texts(http, "a", caroline) == []
    assert page.locator("table.memories").count() == 0 and page.is_disabled("#delete-all")
    # The route itself wants the confirmation: a call without it deletes nothing.
    _add(http, "a", caroline, texts=["Caroline plays the cello."])
    refused = http.delete("/ui/api/memories", headers=auth("a"), params={"user_id": caroline})
    assert refused.status_code == 400 and "confirm" in refused.json()["error"]["message"]
    assert _texts(http, "a", caroline) == ["Caroline plays the cello."]


def test_a_tenant_cannot_reach_another_tenants_user(ui, http):
    theirs = _user("b", "bob")
    (fact,) = _add(http, "b", theirs, texts=["Bob's bank PIN hint is his cat's name."])
    page = ui.open(KEYS["a"], f"#/user/{theirs}/memories")
    error = page.locator("#user-body .error")
    error.wait_for()
    assert "Refused (403)" in error.text_content()
    assert page.locator("table.memories").count() == 0 and page.locator("#user-id").count() == 0
    assert "bank PIN" not in page.content()
    for tab in ("sessions", "search", "ask"):
        ui.go(f"#/{tab}")  # away, then to b's user's tab
        ui.go(f"#/user/{theirs}/{tab}")
        page.wait_for_selector("#user-body .error")
        assert "Refused (403)" in page.text_content("#user-body .error")
        assert page.locator("#user-id, form, table").count() == 0, tab
        assert "bank PIN" not in page.content()
    # The page's own fetch calls, with tenant a's key, on b's user and memory.
    for method, path, body, status in [
            ("GET", f"/ui/api/memories?user_id={theirs}", None, 403),
            ("GET", f"/ui/api/history?id={fact}", None, 404),
            ("POST", "/ui/api/search", {"user_id": theirs, "query": "PIN"}, 403),
            ("POST", "/ui/api/ask", {"user_id": theirs, "question": "PIN?"}, 403),
            ("POST", f"/ui/api/memories/{fact}", {"text": "owned"}, 404),
            ("DELETE", f"/ui/api/memories/{fact}", None, 404),
            ("DELETE", f"/ui/api/memories?user_id={theirs}&confirm={theirs}", None, 403),
            ("GET", f"/ui/api/sessions?user_id={theirs}", None, 403),
            ("GET", f"/ui/api/turns?user_id={theirs}", None, 403),
            ("GET", "/ui/api/server", None, 403)]:
        answer = ui.fetch(method, path, body)
        assert answer["status"] == status, (method, path, answer)
        assert "bank PIN" not in str(answer["body"])
    assert _texts(http, "b", theirs) == ["Bob's bank PIN hint is his cat's name."]


def test_stored_markup_renders_as_text(ui, http):
    user = _user("a", "mallory")
    _add(http, "a", user, texts=[XSS])
    _add(http, "a", user, messages=[{"role": "user", "content": XSS_TURN}],
         session_id="<i>chat</i>")
    page = ui.open(KEYS["a"], f"#/user/{user}/memories")
    page.wait_for_selector("table.memories")
    cells = page.locator("table.memories td.text")
    assert cells.all_text_contents() == [XSS, XSS_TURN]  # the user turn is a fact too
    assert page.get_by_text(XSS).is_visible() and page.get_by_text(XSS_TURN).is_visible()
    assert "<i>chat</i>" in page.locator("table.memories").text_content()
    page.locator("table.memories button", has_text="History").first.click()
    page.wait_for_selector("ol.events li")
    assert XSS in page.text_content("ol.events")
    page.get_by_text(XSS_TURN).click()  # an onclick would run now
    ui.go(f"#/user/{user}/sessions")
    page.wait_for_selector("table.turns td.text")
    assert page.locator("table.turns td.text").text_content() == XSS_TURN
    assert page.locator("table.sessions button.session").text_content() == "<i>chat</i>"
    ui.go(f"#/user/{user}/search")
    page.fill("#search-query", "script")
    page.click("#search-submit")
    page.wait_for_selector("#search-table td.text")
    assert XSS in page.locator("#search-table").text_content()
    page.wait_for_timeout(300)  # an onerror would have fired by now
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img, main script, main iframe, main b, main i").count() == 0


def test_cross_site_writes_are_refused(http, caroline):
    fact = _add(http, "a", caroline, texts=["Caroline's car is a green Fiat."])[0]
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        for method, path, body in [("POST", f"/ui/api/memories/{fact}", {"text": "hacked"}),
                                   ("DELETE", f"/ui/api/memories/{fact}", None),
                                   ("DELETE", "/ui/api/memories", None),
                                   ("POST", "/ui/api/ask", {"user_id": caroline,
                                                            "question": "Car?"})]:
            response = http.request(method, path, headers={**auth("a"), **headers}, json=body,
                                    params={"user_id": caroline, "confirm": caroline})
            assert response.status_code == 403, (headers, method, path, response.text)
            assert "cross-site" in response.json()["error"]["message"]
    assert "Caroline's car is a green Fiat." in _texts(http, "a", caroline)
    same = {"Origin": str(http.base_url).rstrip("/"), "Sec-Fetch-Site": "same-origin"}
    ok = http.post(f"/ui/api/memories/{fact}", headers={**auth("a"), **same},
                   json={"text": "Caroline's car is a red Fiat."})
    assert ok.status_code == 200, ok.text


def test_the_server_panel_shows_the_metrics_and_refreshes(ui, http, caroline):
    tenant = ui.open(KEYS["a"], "#/server")
    tenant.wait_for_selector("#server-body .error")
    assert "admin" in tenant.text_content("#server-body .error")
    admin = Page(ui.context.browser, ui.base_url)
    try:
        page = admin.open(KEYS["admin"], "#/server")
        page.wait_for_selector("#stat-facts")
        assert int(page.text_content("#stat-facts").replace(",", "")) >= len(FACTS)
        assert page.text_content("#stat-slab").endswith("%")
        assert int(page.text_content("#stat-ttft-count").replace(",", "")) > 0
        assert page.locator("#ttft-hist .bar").count() >= 8
        first = page.get_attribute("#server-updated", "data-time")
        http.post("/ui/api/ask", headers=auth("a"), json={"user_id": caroline,
                                                          "question": "Where does she live?",
                                                          "max_tokens": 2})
        page.wait_for_function("t => document.querySelector('#server-updated')?.dataset.time "
                               "!== t", arg=first, timeout=POLLS_MS)
        page.wait_for_function("() => /\\/s$/.test(document.querySelector('#stat-rate')"
                               ".textContent)", timeout=POLLS_MS)  # a rate needs two polls
        admin.shot("server")
    finally:
        admin.close()


def test_pinned_memories_carry_a_pin_marker(ui, http):
    user = _user("a", "pinned")
    (plain,) = _add(http, "a", user, texts=["Pat keeps bees."])
    (pinned,) = _add(http, "a", user, texts=["Pat is vegetarian."], pinned=True)
    page = ui.open(KEYS["a"], f"#/user/{user}/memories")
    page.locator("table.memories tbody tr[data-id]").first.wait_for()
    marker = page.locator(f"table.memories tr[data-id='{pinned}'] td.text span.badge.pinned")
    assert "pinned" in marker.text_content()
    assert page.locator(f"table.memories tr[data-id='{plain}'] span.badge.pinned").count() == 0
