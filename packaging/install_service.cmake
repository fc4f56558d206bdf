# Installs dlrund.service and its settings file with the paths of the prefix installed to,
# known only at install time: /etc/default/dlrund for /usr (the package), PREFIX/etc/default
# elsewhere. Set by packaging/CMakeLists.txt: dlrun_packaging_source, dlrun_packaging_binary,
# dlrun_bindir.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(sysconfdir /etc)
else()
  set(sysconfdir ${CMAKE_INSTALL_PREFIX}/etc)
endif()
set(DLRUND ${CMAKE_INSTALL_PREFIX}/${dlrun_bindir}/dlrund)
set(DLRUND_SETTINGS ${sysconfdir}/default/dlrund)
# A file of this install's own: installs run at once (cpack and cmake --install from one build,
# as the tests do) would otherwise write one file with their different paths.
string(RANDOM LENGTH 12 unique)
set(service ${dlrun_packaging_binary}/dlrund.service.${unique})
configure_file(${dlrun_packaging_source}/dlrund.service.in ${service} @ONLY)
file(INSTALL ${service} DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system
     RENAME dlrund.service)
file(REMOVE ${service})
file(INSTALL ${dlrun_packaging_source}/dlrund.default DESTINATION ${sysconfdir}/default
     RENAME dlrund)
