// What an API token may do. Roles are ordered: each may do what the one
// before it may, and more.
//  approver  lists and reads Runs, answers interactions
//  operator  also starts, cancels, suspends and resumes Runs, and uses sandboxes
//  admin     also gives Runs and sandboxes active workspaces on host paths

export const ROLES = ['approver', 'operator', 'admin'] as const;
export type Role = (typeof ROLES)[number];

/** A token without a role. */
export const DEFAULT_ROLE: Role = 'operator';

export function isRole(value: string): value is Role {
  return (ROLES as readonly string[]).includes(value);
}

/** Whether `role` may do what `needed` may. */
export function allows(role: Role, needed: Role): boolean {
  return ROLES.indexOf(role) >= ROLES.indexOf(needed);
}

/** One entry of STASIS_API_TOKENS. */
export interface ApiToken {
  /** Recorded as the caller of what the token does (respondedBy, the Temporal client identity). */
  name: string;
  secret: string;
  role: Role;
}
