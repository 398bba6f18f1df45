// Validates recorded fuseboxd responses against api/openapi.yaml.
//
// usage: node validate.mjs OPENAPI.yaml RECORDS.jsonl [RECORDS.jsonl ...]
//        node validate.mjs OPENAPI.yaml --routes ROUTES.txt --codes CODES.txt
//
// Each record line is {"method", "path", "status", "content_type", "body"}
// as written by tests/server/harness.c.  A response is valid when its path
// and method name an operation (or, for unknown routes and methods, it is a
// 404 or 405 error body), its status is documented for that operation, its
// media type is one the operation documents for that status, and a JSON
// body validates against the schema (Ajv, JSON Schema 2020-12, the dialect
// of OpenAPI 3.1).  The second form checks that the server's route table
// and error-code table agree with the document.  Exits 1 on any mismatch.
import fs from 'node:fs';
import YAML from 'yaml';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const args = process.argv.slice(2);
if (args.length < 2) {
  console.error('usage: node validate.mjs OPENAPI.yaml RECORDS.jsonl... | --routes F --codes F');
  process.exit(2);
}
const spec = YAML.parse(fs.readFileSync(args[0], 'utf8'));
const ajv = new Ajv2020({ strict: true, allErrors: true });
addFormats(ajv);
// Component schemas become the $defs of one JSON Schema document, so that
// Ajv never compiles the OpenAPI document itself.
function rewrite(node) {
  if (Array.isArray(node)) return node.map(rewrite);
  if (node && typeof node === 'object') {
    const out = {};
    for (const [k, v] of Object.entries(node)) {
      out[k] = k === '$ref' && typeof v === 'string' && v.startsWith('#/components/schemas/')
        ? 'fusebox-schemas#/$defs/' + v.slice('#/components/schemas/'.length)
        : rewrite(v);
    }
    return out;
  }
  return node;
}
ajv.addSchema({ $id: 'fusebox-schemas', $defs: rewrite(spec.components.schemas) });
const compiled = new Map();

function resolve(obj) {
  while (obj && obj.$ref) {
    const path = obj.$ref.replace(/^#\//, '').split('/');
    obj = path.reduce((o, k) => o[k.replace(/~1/g, '/').replace(/~0/g, '~')], spec);
  }
  return obj;
}

const templates = Object.keys(spec.paths).map((tpl) => ({
  tpl,
  re: new RegExp('^' + tpl.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^/}]+\\?\}/g, '[^/]+') + '$'),
}));

function validatorFor(key, schema) {
  if (!compiled.has(key)) compiled.set(key, ajv.compile(rewrite(schema)));
  return compiled.get(key);
}
const errorValidator = () => validatorFor('Error', { $ref: '#/components/schemas/Error' });

function checkRecord(rec) {
  const method = rec.method.toLowerCase();
  const media = (rec.content_type || '').split(';')[0].trim();
  const matches = templates.filter((t) => t.re.test(rec.path));
  // literal segments win over {params}: /v1/tenant vs /v1/tenants/{id}
  const match = matches.find((t) => !t.tpl.includes('{')) || matches[0];
  if (!match || !spec.paths[match.tpl][method]) {
    const want = match ? 405 : 404;
    if (rec.status !== want) return `${rec.method} ${rec.path}: no operation, expected ${want}, got ${rec.status}`;
    const v = errorValidator();
    return v(rec.body) ? null : `${rec.method} ${rec.path} ${rec.status}: ${ajv.errorsText(v.errors)}`;
  }
  const op = spec.paths[match.tpl][method];
  const status = String(rec.status);
  const resp = op.responses[status] ? resolve(op.responses[status]) : null;
  if (!resp) return `${rec.method} ${match.tpl}: status ${status} is not documented`;
  if (!resp.content) return rec.body === null ? null : `${rec.method} ${match.tpl} ${status}: undocumented body`;
  if (!resp.content[media]) return `${rec.method} ${match.tpl} ${status}: media type "${media}" is not documented`;
  if (media !== 'application/json') return null;
  if (rec.body === null || rec.body === undefined) return `${rec.method} ${match.tpl} ${status}: body is not JSON`;
  const v = validatorFor(`${method} ${match.tpl} ${status} ${media}`, resp.content[media].schema);
  if (v(rec.body)) return null;
  return `${rec.method} ${match.tpl} ${status}: ${ajv.errorsText(v.errors)}\n  body: ${JSON.stringify(rec.body).slice(0, 400)}`;
}

let failures = 0;
if (args[1] === '--routes') {
  // ROUTES: "METHOD /pattern" lines; CODES: one error code a line
  const routes = fs.readFileSync(args[2], 'utf8').trim().split('\n').map((l) => l.trim());
  const codes = fs.readFileSync(args[4], 'utf8').trim().split('\n').map((l) => l.trim());
  const documented = new Set();
  for (const [p, item] of Object.entries(spec.paths))
    for (const m of ['get', 'post', 'patch', 'put', 'delete'])
      if (item[m]) documented.add(`${m.toUpperCase()} ${p}`);
  for (const r of routes) if (!documented.has(r)) { console.error(`route not in openapi.yaml: ${r}`); failures++; }
  for (const d of documented) if (!routes.includes(d)) { console.error(`openapi.yaml documents a route the server lacks: ${d}`); failures++; }
  const inSpec = resolve({ $ref: '#/components/schemas/Error' }).properties.error.properties.code.enum;
  for (const c of codes) if (c !== 'ok' && !inSpec.includes(c)) { console.error(`error code not in openapi.yaml: ${c}`); failures++; }
  for (const c of inSpec) if (!codes.includes(c)) { console.error(`openapi.yaml lists an unknown error code: ${c}`); failures++; }
  console.log(`${routes.length} routes and ${codes.length - 1} error codes compared with openapi.yaml`);
} else {
  let n = 0;
  const seen = new Set();
  for (const file of args.slice(1)) {
    if (!fs.existsSync(file)) continue;
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
      if (!line.trim()) continue;
      const rec = JSON.parse(line);
      n++;
      const err = checkRecord(rec);
      if (err) { console.error('INVALID ' + err); failures++; }
      seen.add(`${rec.method} ${rec.status}`);
    }
  }
  console.log(`${n} responses validated against openapi.yaml, ${failures} invalid`);
}
process.exit(failures ? 1 : 0);
