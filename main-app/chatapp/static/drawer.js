// The chat list on a phone: a drawer.
import { $, chatList } from "./page.js";

export const narrow = window.matchMedia("(max-width: 52rem)");

export function setSidebar(open) {
  const toggle = $("open-sidebar");
  document.body.classList.toggle("sidebar-open", open);
  toggle.setAttribute("aria-expanded", String(open));
  $("main").inert = open && narrow.matches;
  if (open) {
    (chatList.querySelector("[aria-current]") || $("close-sidebar")).focus();
  } else if (narrow.matches && $("sidebar").contains(document.activeElement)) {
    toggle.focus();
  }
}
