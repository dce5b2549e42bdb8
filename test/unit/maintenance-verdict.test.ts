import fc from 'fast-check';
import { RESOURCE_STATES } from '../../common/wire-checks';
import type { ExecutionResourceRecord } from '../../common/schemas';
import { verdictFor, type SandboxFacts } from '../../workers/maintenance';

// What host maintenance does with one sandbox of its host, from its owner's status and record. It
// never removes or stops what the owner may still use: a sandbox being provisioned or restored (its
// record may still name the host it comes from), or one whose record names this host.

const STATUSES = ['RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', 'TERMINATED', 'TIMED_OUT'];
const facts = fc.record({
  hostId: fc.constant('host-a'),
  sandboxId: fc.constant('s1'),
  alive: fc.boolean(),
  status: fc.constantFrom(...STATUSES),
  expired: fc.boolean(),
  record: fc.record({
    sandboxId: fc.constantFrom('s1', 's2'),
    provider: fc.constant('local'),
    state: fc.constantFrom(...RESOURCE_STATES),
    fence: fc.nat({ max: 9 }),
    attempts: fc.constant(0),
    hostId: fc.constantFrom(undefined, 'host-a', 'host-b'),
  }),
}) as fc.Arbitrary<SandboxFacts>;

test('property: the verdict of every status, record state, host and liveness', () => {
  fc.assert(
    fc.property(facts, (f) => {
      const verdict = verdictFor(f);
      const ended = f.status !== 'RUNNING';
      const elsewhere = f.record.hostId === 'host-b';
      const moving = f.record.state === 'PROVISIONING' || f.record.state === 'RESTORING';
      let expected: string | undefined;
      if (f.record.sandboxId !== f.sandboxId) expected = undefined;
      else if (f.record.state === 'DESTROYED' && (ended || f.expired)) expected = 'remove';
      else if (f.alive && ended) expected = 'stop';
      else if (f.alive && elsewhere && !moving) expected = 'stop';
      expect(verdict).toBe(expected);
      // Never: stopping compute the owner's record puts here, or a move in flight, while the owner runs.
      if (!ended && (f.record.hostId !== 'host-b' || moving)) expect(verdict === 'stop').toBe(false);
    }),
    { numRuns: 3000 },
  );
});

test('examples: a stray copy of a sandbox that runs on another host is stopped; its move is not', () => {
  const record = (state: ExecutionResourceRecord['state'], hostId: string): ExecutionResourceRecord => ({
    sandboxId: 's1',
    provider: 'local',
    state,
    fence: 2,
    attempts: 0,
    hostId,
  });
  const base = { hostId: 'host-a', sandboxId: 's1', alive: true, status: 'RUNNING', expired: false };
  expect(verdictFor({ ...base, record: record('ACTIVE', 'host-b') })).toBe('stop');
  expect(verdictFor({ ...base, record: record('RELEASED', 'host-b') })).toBe('stop');
  expect(verdictFor({ ...base, record: record('RESTORING', 'host-b') })).toBeUndefined();
  expect(verdictFor({ ...base, record: record('PROVISIONING', 'host-b') })).toBeUndefined();
  expect(verdictFor({ ...base, record: record('ACTIVE', 'host-a') })).toBeUndefined();
  expect(verdictFor({ ...base, alive: false, record: record('ACTIVE', 'host-b') })).toBeUndefined();
});
