// Drives Debian's Chromium (never a downloaded browser) through playwright-core against a
// live `rlrun dashboard` page, and prints what the page showed as one JSON object; the Python
// test (tests/e2e/test_dashboard_browser.py) compares it with the run's files.
//
//   node dashboard.mjs URL OUT_DIR
//
// URL names the run (`http://127.0.0.1:PORT/#run=ID`); the screenshots go to OUT_DIR.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [url, out] = process.argv.slice(2);
const CHROMIUM = process.env.RLRUN_CHROMIUM || "/usr/bin/chromium";
// This machine's network is closed: without these Chromium keeps trying to reach Google.
const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];
const TRAIN = 'path.series[data-name^="train reward"]';

const profile = mkdtempSync(join(tmpdir(), "rlrun-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  args: FLAGS,
  viewport: { width: 1440, height: 1000 },
});
const errors = [];
const result = { errors };
try {
  const page = context.pages()[0] || (await context.newPage());
  page.on("pageerror", (error) => errors.push(`pageerror: ${error.message}`));
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(`console: ${message.text()} (${message.location().url})`);
  });
  await page.goto(url);
  const trainPoints = () =>
    page.evaluate((sel) => {
      const path = document.querySelector(sel);
      return path ? path.dataset.points.split(" ").filter(Boolean).length : 0;
    }, TRAIN);
  // The run is still going: the curve must grow without a reload.
  await page.waitForSelector(TRAIN, { timeout: 300_000 });
  result.first_points = await trainPoints();
  await page.waitForFunction(
    ([sel, n]) => document.querySelector(sel).dataset.points.split(" ").filter(Boolean).length > n,
    [TRAIN, result.first_points],
    { timeout: 300_000, polling: 500 },
  );
  result.later_points = await trainPoints();
  result.reloads = await page.evaluate(() => performance.getEntriesByType("navigation").length);
  await page.waitForFunction(
    () => document.querySelector('#run-header [data-field="phase"]')?.textContent === "succeeded",
    null,
    { timeout: 600_000, polling: 500 },
  );
  await page.waitForTimeout(5000); // two more polls: the last lines are on the page
  result.phase = await page.textContent('#run-header [data-field="phase"]');
  result.charts = await page.$$eval("[data-chart]", (charts) => charts.map((c) => c.dataset.chart));
  result.reward = await page.$$eval('[data-chart="reward"] path.series', (paths) =>
    paths.map((p) => ({
      name: p.dataset.name,
      points: p.dataset.points.split(" ").filter(Boolean).map((s) => s.split(":").map(Number)),
      vertices: (p.getAttribute("d").match(/[ML]/g) || []).length,
    })),
  );
  await page.screenshot({ path: join(out, "curves.png"), fullPage: true });

  await page.click('#tabs button[data-tab="traces"]');
  await page.waitForSelector(".trace-card .tok.rl", { timeout: 30_000 });
  result.step = await page.inputValue("#trace-step");
  result.group = Number(await page.getAttribute(".group-card.selected", "data-group"));
  const card = page.locator(".trace-card").first();
  result.trace = await card.getAttribute("data-trace");
  const token = card.locator(".tok.rl").first();
  result.token_index = Number(await token.getAttribute("data-index"));
  await token.click();
  result.advantage_text = await card.locator('[data-field="advantage"]').textContent();
  result.logprob_text = await card.locator('[data-field="logprob"]').textContent();
  result.kind_text = await card.locator('[data-field="kind"]').textContent();
  await page.screenshot({ path: join(out, "traces.png"), fullPage: false });
} catch (error) {
  result.failure = String(error && error.stack ? error.stack : error);
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.stdout.write(JSON.stringify(result) + "\n");
