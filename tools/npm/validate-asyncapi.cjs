// Parse and validate an AsyncAPI document with the real @asyncapi/parser (pinned in package-lock.json) and print
// one JSON line: whether it parsed, how many channels, operations and messages it holds, and every diagnostic
// (severity 0 error, 1 warning, 2 information, 3 hint). Used by tests/unit/contracts/test_asyncapi_ecosystem.py.
// Usage (from anywhere): node tools/npm/validate-asyncapi.cjs docs/asyncapi.yaml
const { Parser, fromFile } = require('@asyncapi/parser');

(async () => {
  const { document, diagnostics } = await fromFile(new Parser(), process.argv[2]).parse();
  console.log(JSON.stringify({
    parsed: document !== undefined,
    channels: document ? document.channels().length : 0,
    operations: document ? document.operations().length : 0,
    messages: document ? document.allMessages().length : 0,
    diagnostics: diagnostics.map(d => ({ code: d.code, severity: d.severity, message: d.message,
                                         path: d.path.join('/') })),
  }));
})().catch(err => { console.error(err); process.exit(2); });
