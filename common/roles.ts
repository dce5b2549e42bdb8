// What an API token may do. The first three roles are ordered: each may do what
// the one before it may, and more.
//  approver  lists and reads Runs, answers interactions
//  operator  also starts, cancels, suspends and resumes Runs, and uses sandboxes
//  admin     also gives Runs and sandboxes active workspaces on host paths
// The fourth stands apart, for the AI agent's own token (MCP):
//  agent     what an operator may, except answering interactions, so an agent
//            never approves what it asked a person to decide

export const ROLES = ['agent', 'approver', 'operator', 'admin'] as const;
export type Role = (typeof ROLES)[number];

/** The ordered roles, least first. */
const LADDER: readonly Role[] = ['approver', 'operator', 'admin'];
/** Where an agent stands on the ladder for everything but answering. */
const AGENT_RANK: Role = 'operator';

/** A token without a role. */
export const DEFAULT_ROLE: Role = 'operator';

export function isRole(value: string): value is Role {
  return (ROLES as readonly string[]).includes(value);
}

/** Whether `role` may do what `needed` may (answering aside: see mayAnswer). */
export function allows(role: Role, needed: Role): boolean {
  const rank = (r: Role) => LADDER.indexOf(r === 'agent' ? AGENT_RANK : r);
  return rank(role) >= rank(needed);
}

/** Whether `role` may answer interactions: every role but `agent`. */
export function mayAnswer(role: Role): boolean {
  return role !== 'agent';
}

/** One entry of STASIS_API_TOKENS. */
export interface ApiToken {
  /** Recorded as the caller of what the token does (respondedBy, the Temporal client identity). */
  name: string;
  secret: string;
  role: Role;
}
