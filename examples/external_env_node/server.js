// An rlrun env-server in Node, written from proto/rlrun/v1 and docs/env-protocol.md alone.
//
// It serves one environment, `reverse-text` (reverse a string of 3-8 lowercase letters;
// reward 1 - normalised edit distance), and has no tokenizer: every token id comes from the
// InferenceService's text-level RPCs. A model-played target is one GenerateChat call per group
// (n = the group size); the warm start's oracle (a RULE target) is the reference answer,
// tokenized by RenderChat and Tokenize on the plan's text_addresses. It implements GetInfo,
// RunGroup and Cancel; the other RPCs answer UNIMPLEMENTED, which the orchestrator never asks
// for here. No grpc.health.v1: the orchestrator is ready once GetInfo answers.
//
//   npm ci && node server.js --port 50071
//   # prints: external env-server listening on 127.0.0.1:50071

"use strict";

const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "../../proto");
const ENV_ID = "reverse-text";
const SIZES = { train: 1000000, eval: 256 };
const RETRYABLE = new Set([
  grpc.status.UNAVAILABLE,
  grpc.status.DEADLINE_EXCEEDED,
  grpc.status.RESOURCE_EXHAUSTED,
  grpc.status.ABORTED,
]);

const definition = protoLoader.loadSync(["rlrun/v1/env.proto", "rlrun/v1/inference.proto"], {
  includeDirs: [PROTO_ROOT],
  keepCase: true, // field names as the protos spell them
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
});
const rlrun = grpc.loadPackageDefinition(definition).rlrun.v1;

// -- the environment ------------------------------------------------------------------------

// A small seeded PRNG (mulberry32): task `idx` of a split is always the same string.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function taskText(split, idx) {
  const next = rng(split === "eval" ? 0x9e3779b9 ^ idx : idx * 2654435761);
  const length = 3 + Math.floor(next() * 6);
  let text = "";
  for (let i = 0; i < length; i++) text += String.fromCharCode(97 + Math.floor(next() * 26));
  return text;
}

function editDistance(a, b) {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    row = next;
  }
  return row[b.length];
}

function score(answer, text) {
  const target = [...text].reverse().join("");
  const longest = Math.max(answer.length, target.length);
  return longest === 0 ? 1 : 1 - editDistance(answer, target) / longest;
}

// -- inference clients ----------------------------------------------------------------------

const clients = new Map();
let turn = 0;

function inference(addresses) {
  const address = addresses[turn++ % addresses.length];
  if (!clients.has(address)) {
    clients.set(address, new rlrun.InferenceService(address, grpc.credentials.createInsecure()));
  }
  return clients.get(address);
}

function call(client, method, request) {
  return new Promise((resolve, reject) =>
    client[method](request, { deadline: Date.now() + 120000 }, (error, reply) =>
      error ? reject(error) : resolve(reply),
    ),
  );
}

// Completions of one group: [{token_ids, logprobs, text, finish_reason, start, end}] x n, plus
// the user node's ids and the assistant header (unsampled), all from the InferenceService.
async function complete(plan, target, text, n) {
  const user = { role: "user", content: text };
  if (target.model.kind === "ENDPOINT_KIND_RULE") {
    // The oracle: the reference answer, as if sampled with logprob 0, closed by the end token.
    const tokens = inference(plan.text_addresses);
    const answer = [...text].reverse().join("");
    const rendered = await call(tokens, "RenderChat", { messages: [user], add_generation_prompt: true });
    const ids = (await call(tokens, "Tokenize", { text: answer })).token_ids;
    const sampled = [...ids, plan.tokenizer.stop_token_ids[0]].slice(0, target.sampling.max_tokens);
    const completion = {
      token_ids: sampled,
      logprobs: sampled.map(() => 0),
      text: answer,
      finish_reason: "FINISH_REASON_STOP",
      start: 0,
      end: 0,
    };
    return { rendered, completions: Array(n).fill(completion) };
  }
  // The plan's sampling as is (its stop_token_ids end the reply at the end of the message),
  // asking for the whole group in one call.
  const reply = await call(inference(target.model.addresses), "GenerateChat", {
    request_id: `${ENV_ID}-${Date.now()}`,
    messages: [user],
    sampling: { ...target.sampling, n },
  });
  if (reply.completions.length !== n) {
    throw Object.assign(new Error(`GenerateChat returned ${reply.completions.length} of ${n}`), {
      invalid: true,
    });
  }
  return {
    rendered: reply.prompt,
    completions: reply.completions.map((c) => ({
      token_ids: c.completion.token_ids,
      logprobs: c.completion.logprobs,
      text: c.text,
      finish_reason: c.completion.finish_reason,
      start: Number(c.completion.policy_version_start),
      end: Number(c.completion.policy_version_end),
    })),
  };
}

// -- the EnvService -------------------------------------------------------------------------

function badRequest(field, message) {
  return { code: grpc.status.INVALID_ARGUMENT, details: `${field}: ${message}` };
}

function checkRequest(request) {
  const task = request.task || {};
  if (task.env !== ENV_ID) return badRequest("task.env", `this env-server hosts no env '${task.env}'`);
  if (!(task.split in SIZES)) return badRequest("task.split", `unknown split '${task.split}'`);
  if (!(task.idx >= 0 && task.idx < SIZES[task.split])) {
    return badRequest("task.idx", `${task.idx} is out of range [0, ${SIZES[task.split]})`);
  }
  if (!(request.n > 0)) return badRequest("n", `must be positive, got ${request.n}`);
  const targets = (request.plan && request.plan.targets) || [];
  if (targets.length !== 1) return badRequest("plan.targets", "a single-agent env needs exactly one target");
  return null;
}

function baseTrace(request, i, text) {
  const id = `${request.group_id}/${i}`;
  return {
    id,
    rollout_id: id,
    group_id: request.group_id, // echoed, as every trace must
    task: {
      env: request.task.env,
      split: request.task.split,
      idx: request.task.idx,
      data: JSON.stringify({ text }),
    },
    member_id: request.plan.targets[0].member_id, // "policy"
  };
}

async function runGroup(request) {
  const text = taskText(request.task.split, request.task.idx);
  const plan = request.plan;
  const target = plan.targets[0];
  const started = Date.now();
  let result;
  try {
    result = await complete(plan, target, text, request.n);
  } catch (error) {
    // A failed model call is data: n traces with a (retryable when transient) error.
    const retryable = error.invalid === true || RETRYABLE.has(error.code);
    return Array.from({ length: request.n }, (_, i) => ({
      ...baseTrace(request, i, text),
      stop_condition: "STOP_CONDITION_ERROR",
      errors: [{ type: "ModelCallError", message: String(error.details || error.message), retryable }],
    }));
  }
  const userIds = result.rendered.messages[0].token_ids;
  const header = result.rendered.generation_prompt;
  return result.completions.map((c, i) => {
    const reward = score(c.text, text);
    const truncated = c.finish_reason === "FINISH_REASON_LENGTH";
    return {
      ...baseTrace(request, i, text),
      nodes: [
        { id: "u", role: "ROLE_USER", content: text, token_ids: userIds, sampled_mask: userIds.map(() => false) },
        {
          id: "a",
          parent: "u",
          role: "ROLE_ASSISTANT",
          content: c.text,
          token_ids: [...header, ...c.token_ids],
          sampled_mask: [...header.map(() => false), ...c.token_ids.map(() => true)],
          logprobs: c.logprobs,
        },
      ],
      branches: [{ node_ids: ["u", "a"] }],
      rewards: { similarity: { score: reward, weight: 1 } },
      reward,
      stop_condition: truncated ? "STOP_CONDITION_LENGTH" : "STOP_CONDITION_COMPLETED",
      is_truncated: truncated,
      policy_span: { start: c.start, end: c.end },
      timing: { generation_s: (Date.now() - started) / 1000, total_s: (Date.now() - started) / 1000 },
    };
  });
}

const service = {
  GetInfo(_call, callback) {
    callback(null, {
      envs: [
        {
          env_id: ENV_ID,
          task_counts: SIZES,
          reward_range: { min: 0, max: 1 },
          // No `tokenizer` (every id comes from inference) and no `temperature` (the plan's is used).
        },
      ],
    });
  },
  RunGroup(call, callback) {
    const refused = checkRequest(call.request);
    if (refused) return callback(refused);
    runGroup(call.request).then(
      (traces) => callback(null, { traces }),
      (error) => callback({ code: grpc.status.INTERNAL, details: String(error.stack || error) }),
    );
  },
  Cancel(_call, callback) {
    callback(null, { cancelled: 0 }); // groups are one short call each; nothing to stop early
  },
};

function main() {
  const args = process.argv.slice(2);
  const option = (name, fallback) => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : fallback;
  };
  const host = option("host", "127.0.0.1");
  const server = new grpc.Server();
  server.addService(rlrun.EnvService.service, service);
  server.bindAsync(`${host}:${option("port", "0")}`, grpc.ServerCredentials.createInsecure(), (error, port) => {
    if (error) throw error;
    console.log(`external env-server listening on ${host}:${port}`);
  });
  const stop = () => server.tryShutdown(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
