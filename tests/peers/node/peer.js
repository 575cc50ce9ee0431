// An eureka-js-client test peer the Rust tests drive.
//
// It registers, heartbeats and fetches (full, then deltas with shouldUseDelta) every --interval
// ms, and prints one JSON line per interval describing what the client sees:
//   {"event":"tick","full":1,"delta":7,"warnings":0,"seen":{"APP":[["id","UP"]]}}
// `warnings` counts client warnings, `unknownActions` the "Unknown delta actionType" ones. On SIGTERM it
// deregisters (DELETE) and prints {"event":"stopped"}.
'use strict';
const { Eureka } = require('eureka-js-client');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const url = new URL(args.server); // e.g. http://127.0.0.1:8761/eureka/apps/
const interval = Number(args.interval || 1000);
const watch = (args.watch || '').split(',').filter(Boolean);
const counts = { full: 0, delta: 0, warnings: 0, unknownActions: 0, errors: 0 };
const emit = (o) => process.stdout.write(JSON.stringify(o) + '\n');

const logger = {
  debug() {}, info() {},
  warn(...m) {
    const message = m.map(String).join(' ');
    if (message.startsWith('Unable to retrieve instances')) return; // an app not registered yet
    counts.warnings += 1;
    if (message.includes('Unknown delta actionType')) counts.unknownActions += 1;
    emit({ event: 'warn', message });
  },
  error(...m) { counts.errors += 1; emit({ event: 'error', message: m.map(String).join(' ') }); },
};

const client = new Eureka({
  logger,
  instance: {
    app: args.app, instanceId: args.id, hostName: '127.0.0.1', ipAddr: '127.0.0.1',
    statusPageUrl: `http://127.0.0.1:${args.port}/info`, healthCheckUrl: `http://127.0.0.1:${args.port}/health`,
    port: { $: Number(args.port), '@enabled': true }, vipAddress: args.app.toLowerCase(),
    dataCenterInfo: { '@class': 'com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo', name: 'MyOwn' },
    metadata: { lang: 'node' },
  },
  eureka: {
    host: url.hostname, port: Number(url.port), servicePath: url.pathname,
    heartbeatInterval: interval, registryFetchInterval: interval, maxRetries: 0,
  },
  shouldUseDelta: true,
});
const full = client.fetchFullRegistry.bind(client);
client.fetchFullRegistry = (cb) => { counts.full += 1; full(cb); };
const delta = client.fetchDelta.bind(client);
client.fetchDelta = (cb) => { counts.delta += 1; delta(cb); };

function seen() {
  const out = {};
  for (const app of watch) {
    out[app] = client.getInstancesByAppId(app).map((i) => [i.instanceId, i.status]).sort();
  }
  return out;
}

client.start((err) => {
  if (err) { emit({ event: 'start-failed', message: String(err) }); process.exit(1); }
  emit({ event: 'started' });
  const timer = setInterval(() => emit({ event: 'tick', ...counts, seen: seen() }), interval);
  process.on('SIGTERM', () => {
    clearInterval(timer);
    client.stop((e) => { emit({ event: 'stopped', error: e ? String(e) : null }); process.exit(e ? 1 : 0); });
  });
});
