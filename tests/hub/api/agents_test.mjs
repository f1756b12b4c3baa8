// What agents ask of `moex-hub serve`, through the official openai client
// (started by tests/hub/test_api_agents.py against the shipped model):
// structured output parsed by the client (chat.completions.parse with a zod
// schema), JSON mode, and a tool-call round trip (tools -> tool_calls ->
// role "tool" -> an answer) with tool_choice "required" and a named function,
// whole and streamed. Prints "ok NAME" or "FAIL NAME: detail" per check; exit 1
// on any failure.
//
// usage: node agents_test.mjs CONFIG.json   {"base": "http://127.0.0.1:P", "key": "K", "model": "ID"}
import fs from 'node:fs';
import OpenAI from 'openai';
import {zodResponseFormat} from 'openai/helpers/zod';
import {z} from 'zod';

const cfg = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const client = new OpenAI({baseURL: `${cfg.base}/v1`, apiKey: cfg.key, maxRetries: 0, timeout: 300000});
let failures = 0;

function check(name, cond, detail = '') {
  console.log(cond ? `ok   ${name}` : `FAIL ${name}: ${detail}`);
  if (!cond) failures++;
}

const show = (s) => String(JSON.stringify(s)).slice(0, 300);

// Bounded strings and enums (and the grammar's bounded white space between tokens): a small model's answer ends
// within max_tokens whatever it writes.
const Person = z.object({
  name: z.string().max(24),
  mood: z.enum(['happy', 'sad', 'calm']),
  adult: z.boolean(),
  tags: z.array(z.string().max(12)).max(3),
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {city: {type: 'string', maxLength: 20}, unit: {type: 'string', enum: ['celsius', 'fahrenheit']}},
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const time = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'The time in a time zone',
    parameters: {type: 'object', properties: {zone: {type: 'string', maxLength: 16}}, required: ['zone'],
                 additionalProperties: false},
  },
};

function argsValid(call) {
  let a;
  try {
    a = JSON.parse(call.function.arguments);
  } catch (e) {
    return false;
  }
  if (call.function.name === 'get_weather')
    return typeof a.city === 'string' && a.city.length <= 20 && ['celsius', 'fahrenheit'].includes(a.unit) &&
           Object.keys(a).length === 2;
  if (call.function.name === 'get_time') return typeof a.zone === 'string' && Object.keys(a).length === 1;
  return false;
}

async function structured() {
  const r = await client.chat.completions.parse({
    model: cfg.model, temperature: 0, max_tokens: 600,
    messages: [{role: 'user', content: 'Describe a person as JSON.'}],
    response_format: zodResponseFormat(Person, 'person'),
  });
  const m = r.choices[0].message;
  check('chat.completions.parse: a parsed object that follows the schema',
        m.parsed && Person.safeParse(m.parsed).success && r.choices[0].finish_reason === 'stop', show(r.choices[0]));
  // JSON mode while sampling, six choices (seeds 1..6): a choice that ends ("stop") is a JSON object; one cut by
  // max_tokens is the start of one (the shipped model writes long keys: not every choice closes in 120 tokens)
  const j = await client.chat.completions.create({
    model: cfg.model, temperature: 0.8, seed: 1, n: 6, max_tokens: 120,
    messages: [{role: 'user', content: 'Answer in JSON.'}], response_format: {type: 'json_object'},
  });
  const isObject = (t) => {
    try {
      const o = JSON.parse(t);
      return o !== null && typeof o === 'object' && !Array.isArray(o);
    } catch (e) {
      return false;
    }
  };
  const ended = j.choices.filter((c) => c.finish_reason === 'stop');
  check('response_format json_object (sampling, n = 6): every choice that ends is a JSON object, the others start one',
        j.choices.length === 6 && ended.length > 0 && ended.every((c) => isObject(c.message.content)) &&
        j.choices.every((c) => c.finish_reason === 'stop' || /^\s*\{/.test(c.message.content)),
        show(j.choices.map((c) => [c.finish_reason, c.message.content.slice(0, 40)])));
}

/* A chat with tools, whole or streamed: the message the client assembles. */
async function callTools(messages, opts) {
  const body = {model: cfg.model, temperature: 0, max_tokens: 400, messages, tools: [weather, time], ...opts};
  if (!opts.stream) {
    const r = await client.chat.completions.create(body);
    return {message: r.choices[0].message, finish: r.choices[0].finish_reason};
  }
  const stream = await client.chat.completions.create(body);
  const calls = [];
  let content = '', finish = null;
  for await (const c of stream) {
    for (const ch of c.choices) {
      if (ch.delta.content) content += ch.delta.content;
      for (const d of ch.delta.tool_calls || []) {
        if (!calls[d.index]) calls[d.index] = {id: d.id, type: d.type, function: {name: d.function?.name, arguments: ''}};
        if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments;
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return {message: {role: 'assistant', content: content || null, tool_calls: calls.length ? calls : undefined},
          finish};
}

async function toolRoundTrip(stream) {
  const tag = stream ? 'streamed' : 'whole';
  const messages = [{role: 'system', content: 'You can call tools.'},
                    {role: 'user', content: 'What is the weather in Paris?'}];
  const first = await callTools(messages, {tool_choice: 'required', parallel_tool_calls: false, stream});
  const calls = first.message.tool_calls || [];
  check(`[${tag}] tool_choice "required": one call with arguments that follow its schema, finish "tool_calls"`,
        calls.length === 1 && argsValid(calls[0]) && first.finish === 'tool_calls' && calls[0].id &&
        calls[0].type === 'function', show(first));
  if (!calls.length) return null;
  const named = await callTools(messages, {tool_choice: {type: 'function', function: {name: 'get_time'}}, stream});
  const nc = named.message.tool_calls || [];
  check(`[${tag}] a named tool_choice: a call of that function`,
        nc.length === 1 && nc[0].function.name === 'get_time' && argsValid(nc[0]), show(named));
  const answer = await callTools([...messages, first.message,
                                  {role: 'tool', tool_call_id: calls[0].id, content: '{"temperature": 21}'}],
                                 {tool_choice: 'none', max_tokens: 12, stream});
  check(`[${tag}] the tool's result back (role "tool"): an answer in text`,
        typeof answer.message.content === 'string' && answer.message.content.length > 0 &&
        !answer.message.tool_calls && ['stop', 'length'].includes(answer.finish), show(answer));
  return [first, named, answer];
}

async function tools() {
  const whole = await toolRoundTrip(false);
  const streamed = await toolRoundTrip(true);
  if (whole && streamed)
    check('streamed tool calls assemble into the whole answer\'s (greedy: same name and arguments)',
          whole.every((w, i) => show(w.message.tool_calls?.map((c) => c.function)) ===
                                show(streamed[i].message.tool_calls?.map((c) => c.function)) &&
                                (w.message.content || '') === (streamed[i].message.content || '')),
          `${show(whole.map((w) => w.message))} vs ${show(streamed.map((s) => s.message))}`);
}

const groups = {structured, tools};
for (const name of cfg.only || Object.keys(groups)) {
  try {
    await groups[name]();
  } catch (e) {
    check(name, false, `threw ${e.constructor.name}: ${e.message}`);
  }
}
process.exit(failures ? 1 : 0);
