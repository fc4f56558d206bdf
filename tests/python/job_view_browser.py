"""Headless Chromium for test_job_view.py, run inside a simulated host (Hosts.popen): a browser
reaches the hosts' addresses only from inside one, and selenium talks to chromedriver on the
loopback of the namespace it runs in, so both run here.

Usage: /usr/bin/python3 job_view_browser.py WORK_DIR   (Debian's python3-selenium)
Starts Chromium (a fresh profile under WORK_DIR, chromedriver's log WORK_DIR/driver.log), then
answers one JSON line on stdout for each JSON line on stdin:
  {"cmd": "open", "url": URL}        -> {"ok": true}
  {"cmd": "look"}                    -> what the job's page shows now (look() below)
  {"cmd": "screenshot", "path": P}   -> {"ok": true}, the window saved as a PNG at P
  {"cmd": "resources"}               -> {"resources": [every URL the page loaded]}
  {"cmd": "quit"}                    -> {"ok": true}, Chromium and chromedriver gone, exit 0
A command that fails answers {"error": "..."}. End of input quits as "quit" does.

Importing netns_fixture installs its connect guard here too.
"""

import json
import sys

import netns_fixture  # noqa: F401  (the guard)
from chromium_fixture import start_chromium

# One read of the page, in one script: the page redraws its tables as it polls, so elements
# found in one call may be gone by the next.
LOOK = """
const cells = (tr) => Array.from(tr.querySelectorAll('td'), td => td.innerText.trim());
const rows = (sel) => Array.from(document.querySelectorAll(sel));
const msg = document.getElementById('message');
return {
  status: document.getElementById('status').textContent,
  message: msg && !msg.hidden ? msg.textContent : null,
  header: Object.fromEntries(
      ['state', 'round', 'restarts', 'nodes', 'ranks', 'pace', 'straggler-count'].map(
          id => [id, document.getElementById(id).textContent])),
  nodes: rows('#nodes-table tbody tr').map(tr => ({replaced: tr.classList.contains('replaced'),
                                                   cells: cells(tr)})),
  ranks: rows('#ranks-table tbody tr[data-rank]').map(tr => ({
    rank: Number(tr.dataset.rank), straggler: tr.classList.contains('straggler'),
    badge: !!tr.querySelector('.badge'), cells: cells(tr)})),
  straggler_rows: rows('#ranks-table tbody tr.straggler').map(tr => Number(tr.dataset.rank)),
  stragglers_box: rows('#stragglers li').map(li => ({rank: Number(li.dataset.rank),
                                                     text: li.innerText})),
  events: rows('#events tbody tr').map(tr => ({kind: tr.dataset.kind,
                                               rank: Number(tr.dataset.rank)})),
  timeline_marks: rows('#timeline .mark').map(g => g.dataset.kind),
  loss_points: Number((document.querySelector('#loss-curve path.curve') || {dataset: {}})
                      .dataset.points || 0),
};
"""


def answer(driver, request):
    cmd = request["cmd"]
    if cmd == "open":
        driver.get(request["url"])
        return {"ok": True}
    if cmd == "look":
        return driver.execute_script(LOOK)
    if cmd == "screenshot":
        return {"ok": driver.save_screenshot(request["path"])}
    if cmd == "resources":
        return {
            "resources": driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name)"
            )
        }
    raise ValueError(f"unknown command {cmd!r}")


def main(work_dir):
    driver, service = start_chromium(work_dir, 1800)
    try:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            request = json.loads(line)
            if request["cmd"] == "quit":
                break
            try:
                reply = answer(driver, request)
            except Exception as e:  # the test sees it, with the page still open for the next
                reply = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(reply), flush=True)
    finally:
        driver.quit()
        if service.process and service.process.poll() is None:
            service.process.kill()
            service.process.wait()
    print(json.dumps({"ok": True}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
