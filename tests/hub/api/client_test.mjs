// The official openai client against a running `moex-hub serve` (started by
// tests/hub/test_api.py, which also gives the greedy references the CLI
// printed). Prints "ok NAME" or "FAIL NAME: detail" per check; exit 1 on any
// failure.
//
// usage: node client_test.mjs CONFIG.json
//   {"base": "http://127.0.0.1:P", "key": "K", "model": "ID", "n_ctx": N,
//    "refs": [{"prompt": [ids], "n": N, "text": "..."}], "parallel": 8}
import fs from 'node:fs';
import OpenAI from 'openai';

const cfg = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({baseURL: `${cfg.base}/v1`, apiKey: cfg.key, maxRetries: 0, timeout: 300000});
let failures = 0;

function check(name, cond, detail = '') {
  console.log(cond ? `ok   ${name}` : `FAIL ${name}: ${detail}`);
  if (!cond) failures++;
}

const show = (s) => String(JSON.stringify(s)).slice(0, 160);

/* A greedy completion of token ids, whole or streamed: [text, finish, usage]. */
async function complete(prompt, n, opts = {}) {
  const body = {model: cfg.model, prompt, max_tokens: n, temperature: 0, ignore_eos: true, ...opts};
  if (!opts.stream) {
    const r = await client.completions.create(body);
    return [r.choices[0].text, r.choices[0].finish_reason, r.usage];
  }
  const stream = await client.completions.create({...body, stream_options: {include_usage: true}});
  let text = '', finish = null, usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return [text, finish, usage];
}

async function chat(messages, opts = {}) {
  const body = {model: cfg.model, messages, temperature: 0, ...opts};
  if (!opts.stream) {
    const r = await client.chat.completions.create(body);
    return [r.choices[0].message.content, r.choices[0].finish_reason, r.usage, r.choices[0].message.role];
  }
  const stream = await client.chat.completions.create(body);
  let text = '', finish = null, role = null;
  for await (const c of stream) {
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return [text, finish, null, role];
}

async function models() {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  check('models.list names the served model', ids.length === 1 && ids[0] === cfg.model, show(ids));
  const one = await client.models.retrieve(cfg.model);
  check('models.retrieve', one.id === cfg.model && one.object === 'model', show(one));
}

async function matchesCli() {
  for (const [i, ref] of cfg.refs.entries()) {
    const [text, finish, usage] = await complete(ref.prompt, ref.n);
    check(`completion ${i} equals the CLI's greedy text`, text === ref.text, `${show(text)} vs ${show(ref.text)}`);
    check(`completion ${i}: finish length, usage`, finish === 'length' && usage.prompt_tokens === ref.prompt.length &&
          usage.completion_tokens === ref.n && usage.total_tokens === ref.prompt.length + ref.n,
          `${finish} ${show(usage)}`);
    const [st, sf, su] = await complete(ref.prompt, ref.n, {stream: true});
    check(`completion ${i} streamed equals it`, st === ref.text && sf === 'length', `${show(st)} ${sf}`);
    check(`completion ${i} stream's usage chunk`, su && su.completion_tokens === ref.n, show(su));
  }
}

async function chats() {
  const msgs = [{role: 'system', content: 'You are terse.'}, {role: 'user', content: 'Say hello.'}];
  const [a, fa, ua, role] = await chat(msgs, {max_tokens: 12});
  check('chat: an assistant message', role === 'assistant' && typeof a === 'string' && ['stop', 'length'].includes(fa),
        `${role} ${show(a)} ${fa}`);
  check('chat: usage', ua && ua.prompt_tokens > 5 && ua.completion_tokens >= 1 && ua.completion_tokens <= 12,
        show(ua));
  const [b] = await chat(msgs, {max_tokens: 12});
  check('chat: greedy twice, same answer', a === b, `${show(a)} vs ${show(b)}`);
  const [s, fs_, , srole] = await chat(msgs, {max_tokens: 12, stream: true});
  check('chat streamed equals the whole answer', s === a && fs_ === fa && srole === 'assistant',
        `${show(s)} vs ${show(a)}, ${fs_} ${srole}`);
  const parts = [{role: 'user', content: [{type: 'text', text: 'Say '}, {type: 'text', text: 'hello.'}]}];
  const [p] = await chat([msgs[0], ...parts], {max_tokens: 12});
  check('chat: content as text parts is the same prompt', p === a, `${show(p)} vs ${show(a)}`);
  const [d] = await chat([{role: 'developer', content: 'You are terse.'}, msgs[1]], {max_tokens: 12});
  check("chat: 'developer' is 'system'", d === a, `${show(d)} vs ${show(a)}`);
}

/* A stop sequence taken from the middle of a greedy reference: the text ends before its first occurrence. */
async function stops() {
  const ref = cfg.refs.find((r) => /[a-z]{3}/i.test(r.text.slice(4)));
  if (!ref) return check('stop: a reference with letters to stop at', false, show(cfg.refs));
  const at = ref.text.slice(4).search(/[a-z]{3}/i) + 4;
  const stop = ref.text.slice(at, at + 3);
  const want = ref.text.slice(0, ref.text.indexOf(stop));
  for (const stream of [false, true]) {
    const [t, f, u] = await complete(ref.prompt, ref.n, {stop, stream});
    check(`stop '${stop}'${stream ? ' streamed' : ''}`, t === want && f === 'stop', `${show(t)} vs ${show(want)} ${f}`);
    if (!stream) check('stop: fewer tokens than asked', u.completion_tokens < ref.n, show(u));
  }
  const [t2, f2] = await complete(ref.prompt, ref.n, {stop: ['\u0001never', stop]});
  check('stop: a list of them', t2 === want && f2 === 'stop', `${show(t2)} ${f2}`);
}

async function limits() {
  const ref = cfg.refs[0];
  const [t, f, u] = await complete(ref.prompt, 5);
  check('max_tokens 5: five tokens, finish length', u.completion_tokens === 5 && f === 'length', `${show(u)} ${f}`);
  check('max_tokens 5: a prefix of the longer run', ref.text.startsWith(t.replace(/\uFFFD$/, '')), show(t));
}

async function seeds() {
  const ref = cfg.refs[0];
  const opts = {temperature: 1.0, top_k: 0, top_p: 1, min_p: 0};
  const [a] = await complete(ref.prompt, 24, {...opts, seed: 42});
  const [b] = await complete(ref.prompt, 24, {...opts, seed: 42});
  const [c] = await complete(ref.prompt, 24, {...opts, seed: 43});
  check('seed 42 twice: the same text', a === b, `${show(a)} vs ${show(b)}`);
  check('seed 43: another text', a !== c, show(c));
  check('sampling differs from greedy', a !== ref.text.slice(0, a.length) || a.length === 0, show(a));
}

async function expectError(name, fn, status, code, param) {
  try {
    await fn();
    check(name, false, 'no error');
  } catch (e) {
    const ok = e instanceof OpenAI.APIError && e.status === status && (code === undefined || e.code === code) &&
               (param === undefined || e.param === param) && typeof e.message === 'string';
    check(name, ok, `${e.constructor.name} ${e.status} code=${e.code} param=${e.param} ${e.message}`);
  }
}

async function errors() {
  await expectError('unknown model: 404 model_not_found',
                    () => client.completions.create({model: 'gpt-4', prompt: 'x', max_tokens: 1}), 404,
                    'model_not_found', 'model');
  await expectError('prompt longer than the context: 400 context_length_exceeded',
                    () => client.completions.create({model: cfg.model, prompt: Array(cfg.n_ctx + 5).fill(5),
                                                     max_tokens: 1}), 400, 'context_length_exceeded');
  await expectError('streamed prompt longer than the context: still a 400 before the stream',
                    () => client.completions.create({model: cfg.model, prompt: Array(cfg.n_ctx).fill(5),
                                                     max_tokens: 1, stream: true}), 400, 'context_length_exceeded');
  await expectError('a wrong type: 400 with the field', () => client.completions.create({model: cfg.model,
                    prompt: 'x', max_tokens: 'many'}), 400, undefined, 'max_tokens');
  await expectError('temperature out of range: 400', () => client.chat.completions.create({model: cfg.model,
                    messages: [{role: 'user', content: 'x'}], temperature: 7}), 400, undefined, 'temperature');
  const two = await client.chat.completions.create({model: cfg.model, messages: [{role: 'user', content: 'x'}], n: 2,
                                                    max_tokens: 4, temperature: 0});
  check('n: 2 gives two choices (greedy: the same text)', two.choices.length === 2 && two.choices[1].index === 1 &&
        two.choices[0].message.content === two.choices[1].message.content, show(two));
  await expectError('n > 8: 400', () => client.chat.completions.create({model: cfg.model,
                    messages: [{role: 'user', content: 'x'}], n: 9}), 400, undefined, 'n');
  await expectError('an unknown role: 400', () => client.chat.completions.create({model: cfg.model,
                    messages: [{role: 'wizard', content: 'x'}]}), 400, undefined, 'messages');
  await expectError('no messages: 400', () => client.chat.completions.create({model: cfg.model, messages: []}),
                    400, undefined, 'messages');
  const r = await client.chat.completions.create({model: cfg.model, messages: [{role: 'user', content: 'x'}],
                                                  max_tokens: 2, user: 'u1', presence_penalty: 0, logit_bias: {}});
  check('fields that ask for nothing are accepted', r.choices.length === 1, show(r));
  await expectError('an unknown field: 400 naming it', () => client.chat.completions.create({model: cfg.model,
                    messages: [{role: 'user', content: 'x'}], max_tokens: 2, some_future_field: {a: 1}}), 400,
                    undefined, 'some_future_field');
  const bad = new OpenAI({baseURL: `${cfg.base}/v1`, apiKey: 'wrong-key', maxRetries: 0});
  await expectError('a wrong API key: 401', () => bad.models.list(), 401, 'invalid_api_key');
  await expectError('a wrong API key on chat: 401', () => bad.chat.completions.create({model: cfg.model,
                    messages: [{role: 'user', content: 'x'}]}), 401, 'invalid_api_key');
}

/* parallel requests at once (chat and completions, whole and streamed) equal the same requests one by one. */
async function concurrent() {
  const n = cfg.parallel || 8, gen = cfg.concurrent_tokens || 20;
  const jobs = [];
  for (let i = 0; i < n; i++) {
    const ref = cfg.refs[i % cfg.refs.length];
    const prompt = ref.prompt.map((t, k) => (k === 0 ? t : (t + 97 * i) % 30000));
    if (i % 2) jobs.push(() => complete(prompt, gen, {stream: i % 4 === 1}).then((r) => r[0]));
    else jobs.push(() => chat([{role: 'user', content: `Request ${i}: count to ${i + 3}.`}],
                              {max_tokens: gen, ignore_eos: true, stream: i % 4 === 2}).then((r) => r[0]));
  }
  const alone = [];
  for (const j of jobs) alone.push(await j());
  const t0 = Date.now();
  const together = await Promise.all(jobs.map((j) => j()));
  const same = alone.map((a, i) => a === together[i]);
  check(`${n} concurrent greedy requests equal each run alone`, same.every(Boolean),
        `${show(same)} e.g. ${show(together[same.indexOf(false)])} vs ${show(alone[same.indexOf(false)])}`);
  console.log(`     (${n} together: ${((Date.now() - t0) / 1000).toFixed(2)} s)`);
}

const groups = {models, matchesCli, chats, stops, limits, seeds, errors, concurrent};
for (const name of cfg.only || Object.keys(groups)) {
  try {
    await groups[name]();
  } catch (e) {
    check(name, false, `threw ${e.constructor.name}: ${e.message}`);
  }
}
process.exit(failures ? 1 : 0);
